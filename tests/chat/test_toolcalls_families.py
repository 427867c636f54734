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
ENVELOPES = [
    "hermes",
    "llama3_json",
    "mistral_json_array",
    "mistral_json_array_spm",
    "mistral_name_args",
    "mistral_call_id",
    "qwen3_coder",
]
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
    if load_envelope(env_name).call_id:  # ids the model wrote are the calls' ids
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


@pytest.mark.parametrize("bad", ["id00000[ARGS]", "id0000000X[ARGS]", "id-000000[ARGS]", "id0000000"])
def test_mistral_v11_call_without_a_whole_id_then_args_is_no_call(bad):
    """[TOOL_CALLS]NAME[CALL_ID] must go on with a 9-character id and [ARGS]: else the text stays content."""
    text = "[TOOL_CALLS]shell_exec[CALL_ID]" + bad + '{"cmd": "ls"}'
    out = parse_tool_calls(text, load_envelope("mistral_call_id"), TOOLS)
    assert out.tool_calls == () and out.content == text


@pytest.mark.parametrize("env_name", ENVELOPES)
def test_streaming_one_character_at_a_time_keeps_calls_whose_arguments_hold_the_trigger_text(env_name):
    """ARGS holds the text '[TOOL_CALLS]' in a string: while the JSON is incomplete it is no trigger."""
    text, calls = reply(env_name)
    parser, events = stream(env_name, text, [1] * len(text))
    assert [c.name for c in parser.calls] == [n for n, _ in calls]


@pytest.mark.parametrize(
    ("env_name", "broken", "good"),
    [
        ("mistral_name_args", '[TOOL_CALLS]shell_exec[ARGS]{"cmd": 1', "[TOOL_CALLS]submit[ARGS]{}"),
        (
            "mistral_call_id",
            '[TOOL_CALLS]shell_exec[CALL_ID]a1B2c3D4e[ARGS]{"cmd": "x", ',
            "[TOOL_CALLS]submit[CALL_ID]Zz9Yy8Xx7[ARGS]{}",
        ),
    ],
)
def test_a_broken_call_followed_by_a_trigger_outside_a_string_is_content(env_name, broken, good):
    for sizes in ([len(broken + good)], [1] * len(broken + good)):
        parser, events = stream(env_name, broken + good, sizes)
        assert [c.name for c in parser.calls] == ["submit"]
        assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == broken


@pytest.mark.parametrize(
    ("env_name", "cut", "name", "so_far"),
    [
        ("mistral_name_args", '[TOOL_CALLS]shell_exec[ARGS]{"cmd": "ec', "shell_exec", '{"cmd": "ec'),
        (
            "mistral_call_id",
            '[TOOL_CALLS]shell_exec[CALL_ID]a1B2c3D4e[ARGS]{"cmd": "ec',
            "shell_exec",
            '{"cmd": "ec',
        ),
        ("mistral_call_id", "[TOOL_CALLS]shell_exec[CALL_ID]a1B2", "shell_exec", ""),
        ("mistral_call_id", "[TOOL_CALLS]shell_ex", "shell_ex", ""),
    ],
)
def test_a_call_cut_by_max_tokens_reports_its_name_and_arguments_so_far(env_name, cut, name, so_far):
    from server.chat.respond import incomplete_call

    got = incomplete_call(cut, load_envelope(env_name))
    assert (got.name, got.arguments_so_far) == (name, so_far)
