from __future__ import annotations

from array import array

from server.cache_report import SessionPrompt, SessionTable, common_prefix, explain
from server.chat.template import render_chat
from server.families.envelope import load_envelope
from server.protocol import ChatMessage

ENV = load_envelope("hermes")


def prompt(tokenizer, messages, tools=None) -> SessionPrompt:
    rendered = render_chat([ChatMessage.model_validate(m) for m in messages], tools, ENV)
    enc = tokenizer(rendered.text, add_special_tokens=False, return_offsets_mapping=True)
    return SessionPrompt(
        array("l", enc["input_ids"]), array("l", (s for s, _ in enc["offset_mapping"])), rendered
    )


def tool(name):
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def test_common_prefix():
    assert common_prefix(list(range(1000)), list(range(999)) + [5]) == 999
    assert common_prefix([], [1]) == 0


def test_extended_session_is_not_a_divergence(tokenizer):
    a = prompt(tokenizer, [{"role": "user", "content": "one"}])
    b = prompt(
        tokenizer,
        [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": "two"},
        ],
    )
    e = explain(a, b, cached_tokens=(len(a.token_ids) // 16) * 16, block_size=16)
    assert e.kind == "extended" and e.diverged_at_token is None and e.reason is None
    assert explain(None, b, 0, 16).kind == "new_session"


def test_timestamp_in_system_prompt_is_named(tokenizer):
    a = prompt(tokenizer, [{"role": "system", "content": "You are an agent. Time: 10:41:07. Be precise."}])
    b = prompt(tokenizer, [{"role": "system", "content": "You are an agent. Time: 10:42:55. Be precise."}])
    e = explain(a, b, 0, 16)
    assert e.kind == "diverged"
    assert a.token_ids[: e.diverged_at_token] == b.token_ids[: e.diverged_at_token]
    assert a.token_ids[e.diverged_at_token] != b.token_ids[e.diverged_at_token]
    assert "system message changed at character 28" in e.reason
    assert "10:4‸1:07" in e.reason and "10:4‸2:55" in e.reason


def test_removed_tool_is_named(tokenizer):
    msgs = [{"role": "user", "content": "go"}]
    a = prompt(tokenizer, msgs, [tool("browser_open"), tool("shell_exec")])
    b = prompt(tokenizer, msgs, [tool("shell_exec")])
    e = explain(a, b, 0, 16)
    assert e.kind == "diverged" and "removed ['browser_open']" in e.reason and "tools block" in e.reason


def test_edited_earlier_message_is_located(tokenizer):
    base = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "ok"},
        {"role": "tool", "content": "file listing: a.py b.py"},
    ]
    a = prompt(tokenizer, base)
    edited = [dict(m) for m in base]
    edited[2]["content"] = "file listing: a.py c.py"
    b = prompt(tokenizer, [*edited, {"role": "user", "content": "next"}])
    e = explain(a, b, 0, 16)
    assert "message 2 (tool) changed" in e.reason


def test_evicted_prefix_is_explained(tokenizer):
    a = prompt(tokenizer, [{"role": "user", "content": "word " * 200}])
    b = prompt(tokenizer, [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "x"}])
    e = explain(a, b, cached_tokens=0, block_size=16)
    assert e.kind == "evicted" and "evicted" in e.reason
    e = explain(a, b, cached_tokens=0, block_size=16, cache_enabled=False)
    assert e.kind == "disabled" and "prefix cache is off" in e.reason


def test_session_table_is_bounded_lru():
    t = SessionTable(2)
    for k in "abc":
        t.put(k, k)  # type: ignore[arg-type]
    assert t.get("a") is None and t.get("c") == "c" and len(t) == 2
