"""The diagnosis on hand-made conversations (real tokenizer): one type per miss, offset, fix, cost."""

from __future__ import annotations

import dataclasses

from server.cache_diag import CacheState, Prompt, diagnose
from server.cache_diag.fingerprint import BLOCK, common_prefix, hashed_common_prefix
from tests.cache_diag.helpers import SETTINGS, hashed, prompt, run, tool

LONG = "Rules: be precise, cite files, run the tests before you answer. " * 12
SYSTEM = {"role": "system", "content": "Time: 10:41:07. You are an agent. " + LONG}
TASK = {"role": "user", "content": "Fix the failing test in tests/test_cli.py and explain the cause. " * 6}
TOOLS = [tool("browser_open"), tool("shell_exec"), tool("file_read")]
TAIL = {"role": "user", "content": "Here is the log of the next run, read it before you go on. " * 8}


def turns(*extra):
    return [SYSTEM, TASK, *extra]


def test_common_prefix_and_hashed_prefix_agree(tokenizer):
    assert common_prefix(list(range(1000)), [*range(999), 5]) == 999
    assert common_prefix([], [1]) == 0
    a = prompt(tokenizer, turns(), TOOLS)
    b = prompt(tokenizer, [dict(SYSTEM, content=SYSTEM["content"] + " More."), TASK], TOOLS)
    exact = common_prefix(a.ids, b.ids)
    assert hashed_common_prefix(a.fp, b.fp) == exact > BLOCK


def test_append_only_is_not_a_miss_and_partial_block_is_not_either(tokenizer):
    a = prompt(tokenizer, turns(), TOOLS)
    b = prompt(
        tokenizer, turns({"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}), TOOLS
    )
    d = run(a, b)
    assert d.type is None and d.missed_tokens == 0 and d.diverged_at_token is None
    # one block less than everything: the partial tail the cache never keeps is not a miss
    full = (min(a.fp.core_tokens, b.fp.n_tokens - 1) // 32) * 32
    assert run(a, b, cached=full).type is None
    assert run(a, b, cached=full - 32).type == "evicted"


def test_timestamp_in_system_prompt_is_named_with_offset_and_fix(tokenizer):
    a = prompt(tokenizer, turns(), TOOLS)
    b = prompt(
        tokenizer, [dict(SYSTEM, content=SYSTEM["content"].replace("10:41:07", "10:42:55")), TASK], TOOLS
    )
    d = run(a, b)
    assert d.type == "system_changed"
    assert a.ids[: d.diverged_at_token] == b.ids[: d.diverged_at_token]
    assert a.ids[d.diverged_at_token] != b.ids[d.diverged_at_token]
    assert d.detail["character"] == 10  # "Time: 10:4" then '1' vs '2'
    assert "character 10 of the system message" in d.fix and "move it to the end" in d.fix
    assert "10:4‸2:55" in d.reason and "1:07" not in d.reason  # the baseline is never quoted
    assert "baseline from character" in d.reason and "sha256" in d.reason
    reusable = min(a.fp.core_tokens, b.fp.n_tokens - 1)  # what the cache could have served
    assert d.missed_tokens == reusable // 32 * 32 - (d.diverged_at_token // 32) * 32


def test_tools_changes_name_the_tool(tokenizer):
    base = prompt(tokenizer, turns(), TOOLS)
    cases = {
        "removed": [TOOLS[0], TOOLS[2]],
        "added": [*TOOLS[:2], tool("browser_click"), TOOLS[2]],
        "reordered": [TOOLS[1], TOOLS[0], TOOLS[2]],
        "edited": [TOOLS[0], tool("shell_exec", "now with a timeout"), TOOLS[2]],
    }
    expected_tool = {"removed": "shell_exec", "added": "browser_click", "reordered": "shell_exec"}
    for change, tools in cases.items():
        d = run(base, prompt(tokenizer, turns(), tools))
        assert d.type == "tools_changed", change
        assert d.detail["change"] == change
        assert d.detail["tool"] == expected_tool.get(change, "shell_exec")
        assert d.detail["tool"] in d.fix or change == "reordered"
    d = run(base, prompt(tokenizer, turns(), cases["reordered"]))
    assert d.fix == "tools were reordered: send them in a stable order"


def test_a_clients_key_reordering_between_turns_is_named(tokenizer):
    """The prompt keeps the client's JSON key order (as the vendors' templates do): the same
    tool or the same call arguments sent with their keys in another order miss the cache, and
    the report names that, not an edit."""
    calls = {"role": "assistant", "content": "", "tool_calls": [_call("shell_exec")]}
    calls["tool_calls"][0]["function"]["arguments"] = '{"x": "1", "y": 2}'
    result = {"role": "tool", "tool_call_id": "c", "content": "done"}
    base = prompt(tokenizer, turns(calls, result, TAIL), TOOLS)
    swapped = {"type": "object", "properties": {"x": {"type": "string"}}}
    swapped = {
        "function": {"parameters": dict(reversed(swapped.items())), "name": "shell_exec"},
        "type": "function",
    }
    d = run(base, prompt(tokenizer, turns(calls, result, TAIL), [TOOLS[0], swapped, TOOLS[2]]))
    assert d.type == "tools_changed" and d.detail == {"change": "key_order", "tool": "shell_exec"}
    assert "keys of tool 'shell_exec' were sent in another order" in d.reason
    assert "same order every turn" in d.fix
    moved = dict(
        calls,
        tool_calls=[
            dict(calls["tool_calls"][0], function={"name": "shell_exec", "arguments": '{"y":2,"x":"1"}'})
        ],
    )
    d = run(base, prompt(tokenizer, turns(moved, result, TAIL), TOOLS))
    assert d.type == "messages_changed" and d.detail == {
        "change": "key_order",
        "message": 2,
        "role": "assistant",
    }
    assert d.missed_tokens > 0
    # the same arguments with other whitespace render alike: no miss at all
    spaced = dict(
        calls,
        tool_calls=[
            dict(calls["tool_calls"][0], function={"name": "shell_exec", "arguments": '{"x":"1",  "y":2}'})
        ],
    )
    assert run(base, prompt(tokenizer, turns(spaced, result, TAIL), TOOLS)).type is None


def test_messages_edited_removed_inserted(tokenizer):
    hist = [
        {"role": "assistant", "content": "Let me look.", "tool_calls": [_call("shell_exec")]},
        {"role": "tool", "tool_call_id": "c1", "content": "tests/test_cli.py::test_name FAILED " * 5},
        {"role": "assistant", "content": "Now the file.", "tool_calls": [_call("file_read")]},
        {"role": "tool", "tool_call_id": "c2", "content": "def main():\n    return run()\n" * 5},
    ]
    base = prompt(tokenizer, turns(*hist), TOOLS)
    nxt = {"role": "user", "content": "continue"}
    edited = [dict(m) for m in hist]
    edited[1]["content"] = "tests/test_cli.py::test_name PASSED " + edited[1]["content"][36:]
    d = run(base, prompt(tokenizer, turns(*edited, nxt), TOOLS))
    assert (d.type, d.detail["message"], d.detail["change"]) == ("messages_changed", 3, "edited")
    assert d.detail["character"] == len("<tool_response>\ntests/test_cli.py::test_name ")
    d = run(base, prompt(tokenizer, turns(*hist[2:], nxt), TOOLS))
    assert (d.type, d.detail["message"], d.detail["change"], d.detail["count"]) == (
        "messages_changed",
        2,
        "removed",
        2,
    )
    d = run(base, prompt(tokenizer, turns({"role": "user", "content": "wait"}, *hist, nxt), TOOLS))
    assert (d.type, d.detail["message"], d.detail["change"]) == ("messages_changed", 2, "inserted")
    assert "append new messages at the end" in d.fix
    # a retry without the last messages reuses all it keeps (a prefix of the previous prompt)
    assert run(base, prompt(tokenizer, turns(*hist[:3]), TOOLS)).type is None
    assert run(base, prompt(tokenizer, turns(*hist[:2]), TOOLS)).type is None


def test_assistant_reply_sent_back_differently(tokenizer):
    reply = {"role": "assistant", "content": "Done: the test passes now."}
    base = prompt(tokenizer, turns(reply, TAIL), TOOLS)
    changed = dict(reply, content="Done:  the test passes now.")
    d = run(base, prompt(tokenizer, turns(changed, TAIL, reply, TAIL), TOOLS))
    assert d.type == "messages_changed" and d.detail["role"] == "assistant"
    assert "exactly as it was returned" in d.fix


def test_template_rewrite_settings_and_model(tokenizer):
    reply = {"role": "assistant", "content": "<think>long plan</think>Answer."}
    msgs = turns(reply, TAIL)
    base = prompt(tokenizer, msgs, TOOLS)
    # a template that drops earlier reasoning: same request, different rendering of message 2
    shown = turns(dict(reply, content="Answer."), TAIL)
    cur_msgs = [*msgs, {"role": "assistant", "content": "ok"}, TAIL]
    cur_shown = [*shown, {"role": "assistant", "content": "ok"}, TAIL]
    d = run(base, prompt(tokenizer, cur_msgs, TOOLS, rendered_messages=cur_shown))
    assert d.type == "template_rewrote_history" and d.detail["segment"] == "message 2 (assistant)"
    assert d.detail["character"] == 0
    assert d.fix and "template" in d.fix
    # the same rendering change while the family setting changed: settings_changed
    other = {**SETTINGS, "envelope": "other"}
    d = run(base, prompt(tokenizer, cur_msgs, TOOLS, settings=other, rendered_messages=cur_shown))
    assert d.type == "settings_changed" and d.detail["settings"] == ["envelope"]
    # a new cache namespace misses even with identical tokens
    ns = {**SETTINGS, "cache_namespace": "tenant-b"}
    d = run(base, prompt(tokenizer, cur_msgs, TOOLS, settings=ns), cached=0)
    assert d.type == "settings_changed" and d.detail["settings"] == ["cache_namespace"]
    d = run(base, prompt(tokenizer, cur_msgs, TOOLS, model="other-model"), cached=0)
    assert d.type == "model_changed" and d.detail == {"before": "smollm2-135m-instruct", "now": "other-model"}


def test_eviction_and_expiry_say_tier_and_idle_time(tokenizer):
    a = prompt(tokenizer, turns(), TOOLS)
    b = prompt(tokenizer, turns({"role": "assistant", "content": "x"}), TOOLS)
    d = run(a, b, cached=0, idle=41.0, tier="tier 2 (disk)")
    assert d.type == "evicted" and d.detail["tier"] == "tier 2 (disk)" and d.detail["idle_seconds"] == 41.0
    assert d.fix is None and "after 41.0 s idle" in d.reason
    d = run(a, b, cached=0, idle=400.0, retention_s=300.0)
    assert d.type == "expired" and d.detail["retention_seconds"] == 300.0
    assert run(a, b, cached=0, idle=100.0, retention_s=300.0).type == "evicted"
    off = run(a, b, cached=0, enabled=False)
    assert off.type is None and off.missed_tokens == 0  # nothing is expected from a cache that is off
    assert "prefix cache is off" in off.reason


def test_change_and_eviction_together_take_the_larger(tokenizer):
    a = prompt(tokenizer, turns(TAIL), TOOLS)
    edited = dict(TASK, content=TASK["content"][:-20] + "and be quick about it.")
    b = prompt(tokenizer, [SYSTEM, edited, TAIL, {"role": "assistant", "content": "x"}], TOOLS)
    lcp = common_prefix(a.ids, b.ids)
    kept = lcp // 32 * 32
    assert run(a, b, cached=kept).type == "messages_changed"
    assert run(a, b, cached=0).type == "evicted"  # most of what was lost came before the edit


def test_hashed_baseline_gives_the_same_answer(tokenizer):
    a = prompt(tokenizer, turns(), TOOLS)
    b = prompt(
        tokenizer, [dict(SYSTEM, content=SYSTEM["content"].replace("10:41:07", "10:42:55")), TASK], TOOLS
    )
    exact, fp_only = run(a, b), run(hashed(a), b)
    assert (fp_only.type, fp_only.diverged_at_token, fp_only.missed_tokens) == (
        exact.type,
        exact.diverged_at_token,
        exact.missed_tokens,
    )
    assert "about character" in fp_only.fix and "10:4" not in repr(a.fp)


def test_raw_completion_prompt(tokenizer):
    from array import array

    from server.cache_diag import fingerprint
    from server.families.rendered import RenderedPrompt, Segment

    def raw(text: str) -> Prompt:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        r = RenderedPrompt(text, (Segment(0, len(text), "prompt"),), ())
        offs = array("l", (s for s, _ in enc["offset_mapping"]))
        fp = fingerprint(model="m", settings={}, ids=enc["input_ids"], offsets=offs, rendered=r)
        return Prompt(fp, enc["input_ids"], text, offs)

    a, b = raw("Once upon a time " * 40), raw("Twice upon a time " + "Once upon a time " * 40)
    d = diagnose(a, b, CacheState(0, 16))
    assert d.type == "messages_changed" and d.detail == {
        "segment": "prompt",
        "character": 0,
        "change": "edited",
    }


def _call(name):
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": '{"x": "1"}'}}


def test_renderer_note_names_a_template_rewrite_even_when_a_setting_changed(tokenizer):
    reply = {"role": "assistant", "content": "<think>long plan</think>Answer."}
    base = prompt(tokenizer, turns(reply, TAIL), TOOLS)
    msgs = [*turns(reply, TAIL), {"role": "assistant", "content": "ok"}, TAIL]
    shown = [*turns(dict(reply, content="Answer."), TAIL), {"role": "assistant", "content": "ok"}, TAIL]
    cur = prompt(
        tokenizer, msgs, TOOLS, settings={**SETTINGS, "tool_state_machine": "off"}, rendered_messages=shown
    )
    assert run(base, cur).type == "settings_changed"  # nothing else explains it
    noted = dataclasses.replace(cur.fp, notes=("template_rewrote_history", "rewritten before message 2"))
    d = run(base, Prompt(noted, cur.ids, cur.text, cur.offsets))
    assert d.type == "template_rewrote_history" and d.detail["renderer"] == ["rewritten before message 2"]


def test_a_model_template_that_drops_reasoning_is_named(tokenizer):
    """famrender's model-template renderer (Qwen3-style) + our diagnosis, end to end on the tokenizer."""
    from array import array

    from server.cache_diag import fingerprint
    from server.families.model_template import ModelTemplateRenderer
    from server.protocol import ChatMessage
    from tests.families.test_model_template import DROPS_THINKING

    r = ModelTemplateRenderer(DROPS_THINKING)

    def render(msgs):
        out = r.render([ChatMessage(**m) for m in msgs], None)
        enc = tokenizer(out.text, add_special_tokens=False, return_offsets_mapping=True)
        offs = array("l", (s for s, _ in enc["offset_mapping"]))
        fp = fingerprint(
            model="m", settings=SETTINGS, ids=enc["input_ids"], offsets=offs, rendered=out, messages=msgs
        )
        return Prompt(fp, enc["input_ids"], out.text, offs)

    u1 = {"role": "user", "content": TASK["content"]}
    a1 = {
        "role": "assistant",
        "content": "<think>" + "I should read the file first. " * 12 + "</think>Reading.",
    }
    t1 = {"role": "tool", "content": "file contents " * 40}
    prev = render([u1, a1, t1])
    cur = render([u1, a1, t1, {"role": "assistant", "content": "Done."}, TAIL])
    d = run(prev, cur)
    assert d.type == "template_rewrote_history" and d.detail["segment"] == "message 1 (assistant)"
    assert d.detail["renderer"] == ["rewritten before message 1"] and "template" in d.fix
