"""The llamacpp engine's slot table (its prefix cache), without llama_cpp: pure bookkeeping."""

from __future__ import annotations

from server.engines.llamacpp.slots import Evicted, SlotTable, common_length

SYSTEM = list(range(100, 160))  # a shared system prompt of 60 tokens


def test_common_length():
    assert common_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_length([], [1]) == 0
    assert common_length([1, 2], [1, 2]) == 2
    assert common_length([1, 2], [1, 2, 3]) == 2 and common_length([5], [6]) == 0


def test_common_length_finds_the_first_difference_wherever_it_is():
    """The bisection over slices against a token-by-token loop, every split point of a long prompt."""
    a = [(i * 7919) % 1000 for i in range(1000)]
    for at in [*range(0, 40), *range(480, 530), 998, 999]:
        b = a[:at] + [a[at] + 1] + a[at + 1 :]
        assert common_length(a, b) == at
        assert common_length(b[: at + 5], a) == at
    assert common_length(a, a[:777]) == 777 and common_length(a[:777], a) == 777


def test_a_cold_prompt_claims_a_free_slot_with_nothing_cached():
    table = SlotTable(4)
    claim = table.claim([1, 2, 3], "", "s1")
    assert claim is not None and claim.cached == 0 and claim.source is None
    assert claim.slot.busy and claim.slot.tokens == []


def test_the_next_turn_of_a_session_extends_its_own_idle_slot():
    table = SlotTable(4)
    first = table.claim(SYSTEM + [1, 2], "", "s1")
    assert first is not None
    table.release(first.slot, SYSTEM + [1, 2, 7, 8])  # prompt + reply
    nxt = table.claim(SYSTEM + [1, 2, 7, 8, 9, 10], "", "s1")
    assert nxt is not None
    assert nxt.slot is first.slot and nxt.source is None  # the same cells, no copy
    assert nxt.cached == len(SYSTEM) + 4
    assert nxt.slot.tokens == SYSTEM + [1, 2, 7, 8]


def test_another_session_shares_the_system_prompt_by_copy_and_keeps_the_source():
    table = SlotTable(4)
    a = table.claim(SYSTEM + [1, 2], "", "a")
    assert a is not None
    b = table.claim(SYSTEM + [5, 6], "", "b")  # while a still runs
    assert b is not None
    assert b.source is None and b.cached == 0  # a has computed nothing yet
    a.slot.tokens = SYSTEM + [1, 2]  # a's prefill is done
    c = table.claim(SYSTEM + [9], "", "c")
    assert c is not None and c.source is a.slot and c.cached == len(SYSTEM)
    assert c.slot is not a.slot and c.slot.tokens == SYSTEM


def test_a_salt_is_its_own_namespace():
    table = SlotTable(4)
    a = table.claim(SYSTEM + [1], "tenant-a", "")
    assert a is not None
    table.release(a.slot, SYSTEM + [1])
    other = table.claim(SYSTEM + [1, 2], "tenant-b", "")
    assert other is not None and other.cached == 0 and other.source is None


def test_the_last_prompt_token_is_always_computed():
    table = SlotTable(2)
    a = table.claim([1, 2, 3], "", "")
    assert a is not None
    table.release(a.slot, [1, 2, 3])
    again = table.claim([1, 2, 3], "", "")
    assert again is not None and again.cached == 2  # its logits are needed


def test_without_a_free_slot_the_least_recently_used_idle_one_is_dropped():
    table = SlotTable(2)
    a = table.claim([1, 1], "", "a")
    b = table.claim([2, 2], "", "b")
    assert a is not None and b is not None
    assert table.claim([3, 3], "", "c") is None  # every slot runs: wait
    table.release(a.slot, [1, 1, 5])
    table.release(b.slot, [2, 2, 5])
    c = table.claim([3, 3], "", "c")
    # what the dropped slot held is reported (tier 2 saves it before the engine clears it)
    assert c is not None and c.slot is a.slot and c.dropped == (Evicted(a.slot.seq, "", [1, 1, 5]),)
    assert table.cached_tokens() == 3  # b's KV is still kept
    victim = table.evict_one()
    assert victim == Evicted(b.slot.seq, "", [2, 2, 5]) and table.cached_tokens() == 0
    assert table.evict_one() is None


def test_the_next_turn_that_sends_the_reply_back_in_other_tokens_takes_the_old_slot():
    """An agent's next turn holds the previous prompt, then the reply as the client renders it (not
    the tokens the model wrote): the old slot's only other KV is that reply. The turn takes the slot
    trimmed to the prompt, not a copy beside a dead branch that later decodes would attend over."""
    table = SlotTable(4)
    first = table.claim(SYSTEM + [1, 2], "", "s1")
    assert first is not None
    table.release(first.slot, SYSTEM + [1, 2, 7, 8], prompt_len=len(SYSTEM) + 2)
    nxt = table.claim(SYSTEM + [1, 2, 70, 80, 9], "", "s1")
    assert nxt is not None and nxt.slot is first.slot and nxt.source is None
    assert nxt.cached == len(SYSTEM) + 2 and nxt.slot.tokens == SYSTEM + [1, 2]
    assert [s for s in table.slots if s.tokens] == [first.slot]  # no second copy of the prefix


def test_a_prompt_that_parts_inside_the_old_prompt_copies_and_keeps_the_source():
    table = SlotTable(4)
    first = table.claim(SYSTEM + [1, 2], "", "s1")
    assert first is not None
    table.release(first.slot, SYSTEM + [1, 2, 7, 8], prompt_len=len(SYSTEM) + 2)
    branch = table.claim(SYSTEM + [1, 3], "", "s1")  # parts inside the old prompt: a real branch
    assert branch is not None and branch.source is first.slot and branch.slot is not first.slot
    assert first.slot.tokens == SYSTEM + [1, 2, 7, 8]
    other = table.claim(SYSTEM + [1, 2, 70], "other", "s1")  # another namespace (cache salt)
    assert other is not None and other.source is None and other.cached == 0


def test_a_sessionless_prompt_that_holds_the_old_prompt_takes_the_slot_too():
    """``/v1/completions`` keys its session by the whole prompt: each turn is "another session"."""
    table = SlotTable(4)
    first = table.claim(SYSTEM + [1, 2], "", "h:aaa")
    assert first is not None
    table.release(first.slot, SYSTEM + [1, 2, 7, 8], prompt_len=len(SYSTEM) + 2)
    nxt = table.claim(SYSTEM + [1, 2, 70, 80], "", "h:bbb")
    assert nxt is not None and nxt.slot is first.slot and nxt.source is None


def test_the_same_prompt_again_takes_its_old_slot():
    table = SlotTable(2)
    a = table.claim([1, 2, 3], "", "")
    assert a is not None
    table.release(a.slot, [1, 2, 3, 9], prompt_len=3)
    again = table.claim([1, 2, 3], "", "")
    assert again is not None and again.slot is a.slot and again.cached == 2 and a.slot.tokens == [1, 2]
