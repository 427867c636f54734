"""The streaming tool-call parser for every envelope: whole text, any chunking, cut calls."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.chat.toolcalls import CallDelta, ContentDelta, StreamingToolCallParser, parse_tool_calls
from server.families.envelope import load_envelope

TOOLS = [
    {"type": "function", "function": {"name": "shell_exec", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}, "n": {"type": "integer"},
                                         "force": {"type": "boolean"}, "opts": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "submit"}},
]  # fmt: skip
ENVELOPES = ["hermes", "llama3_json", "mistral_json_array", "mistral_name_args", "qwen3_coder"]
ARGS = {"cmd": "echo '</tool_call> [TOOL_CALLS] }]'", "force": True, "n": 3, "opts": {"a": [1, "x"]}}


def reply(env_name: str, content: str = "Let me check.") -> tuple[str, list[tuple[str, dict]]]:
    env = load_envelope(env_name)
    calls = [("shell_exec", ARGS), ("submit", {})] if env.parallel else [("shell_exec", ARGS)]
    if env.trigger == "start" or not env.call_after_text:
        content = ""
    text = env.render_calls(
        [(n, json.dumps(a, sort_keys=True), f"id{i:07d}") for i, (n, a) in enumerate(calls)],
        content + ("\n\n" if content else ""),
    )
    return text, calls


def stream(env_name: str, text: str, sizes: list[int]):
    parser = StreamingToolCallParser(load_envelope(env_name), TOOLS)
    events, pos = [], 0
    for n in sizes:
        events += parser.feed(text[pos : pos + n])
        pos += n
    events += parser.feed(text[pos:])
    events += parser.finish()
    return parser, events


@pytest.mark.parametrize("env_name", ENVELOPES)
def test_calls_parse_back_to_their_arguments(env_name):
    text, calls = reply(env_name)
    out = parse_tool_calls(text, load_envelope(env_name), TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == calls
    assert out.content in (None, "Let me check.")
    if env_name == "mistral_json_array":
        assert [c.id for c in out.tool_calls] == ["id0000000", "id0000001"]


@pytest.mark.parametrize("env_name", ENVELOPES)
@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=60))
def test_streaming_equals_whole_parse_for_any_chunking(env_name, sizes):
    text, _ = reply(env_name)
    parser, events = stream(env_name, text, sizes)
    whole = parse_tool_calls(text, load_envelope(env_name), TOOLS)
    assert tuple(e.call for e in events if isinstance(e, CallDelta)) == whole.tool_calls
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert content.strip() == (whole.content or "")
    assert not parser.in_call and parser.unfinished is None


@pytest.mark.parametrize("env_name", ENVELOPES)
def test_a_cut_call_is_unfinished_and_can_stay_out_of_the_content(env_name):
    text, _ = reply(env_name)
    env = load_envelope(env_name)
    cut = text[: text.index("echo") + 4]  # inside the first call's arguments
    parser = StreamingToolCallParser(env, TOOLS)
    events = parser.feed(cut)
    assert parser.in_call
    events += parser.finish(unfinished_as_content=False)
    assert parser.unfinished and env.opening.split("[")[-1][:3] in parser.unfinished
    leaked = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert "echo" not in leaked and not parser.calls


def test_llama_reply_that_does_not_open_a_call_is_content():
    env = load_envelope("llama3_json")
    for text in ('{"type": "function", "name": "shell_exec", "parameters": {}}', ' {"type": 1}', "Sure."):
        out = parse_tool_calls(text, env, TOOLS)
        assert out.tool_calls == () and out.content == text


def test_qwen_values_are_typed_by_the_schema():
    env = load_envelope("qwen3_coder")
    text = (
        "<tool_call>\n<function=shell_exec>\n<parameter=cmd>\n42\n</parameter>\n"
        "<parameter=n>\n42\n</parameter>\n<parameter=force>\nFalse\n</parameter>\n</function>\n</tool_call>"
    )
    (call,) = parse_tool_calls(text, env, TOOLS).tool_calls
    assert json.loads(call.arguments) == {"cmd": "42", "n": 42, "force": False}
