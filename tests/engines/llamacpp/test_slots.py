"""The llamacpp engine's slot table (its prefix cache), without llama_cpp: pure bookkeeping."""

from __future__ import annotations

from server.engines.llamacpp.slots import Evicted, SlotTable, common_length

SYSTEM = list(range(100, 160))  # a shared system prompt of 60 tokens


def test_common_length():
    assert common_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_length([], [1]) == 0
    assert common_length([1, 2], [1, 2]) == 2


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
