from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from server.chat.toolcalls import CallDelta, ContentDelta, StreamingToolCallParser, parse_tool_calls
from server.families.envelope import load_envelope

ENV = load_envelope("hermes")
CALL = '<tool_call>\n{"name": "browser_open", "arguments": {"url": "https://a.b", "tab": 1}}\n</tool_call>'


def test_parse_calls_and_content():
    out = parse_tool_calls("Let me look.\n" + CALL + "\n" + CALL.replace("browser_open", "shell_exec"), ENV)
    assert out.content == "Let me look."
    assert [c.name for c in out.tool_calls] == ["browser_open", "shell_exec"]
    assert json.loads(out.tool_calls[0].arguments) == {"url": "https://a.b", "tab": 1}


def test_plain_text_and_broken_blocks_stay_content():
    assert parse_tool_calls("just text", ENV).tool_calls == ()
    broken = "<tool_call>\n{not json}\n</tool_call>"
    out = parse_tool_calls(broken, ENV)
    assert out.tool_calls == () and out.content == broken
    unclosed = '<tool_call>\n{"name": "x", "argum'
    out = parse_tool_calls(unclosed, ENV)
    assert out.tool_calls == () and out.content == unclosed


def test_string_arguments_are_accepted():
    out = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', ENV)
    assert out.tool_calls[0].arguments == '{"a": 1}'


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=40))
def test_streaming_equals_whole_parse_for_any_chunking(sizes):
    text = "Thinking <tool about it.\n" + CALL + "\ntrailing <tool_c"
    parser = StreamingToolCallParser(ENV)
    events = []
    pos = 0
    for n in sizes:
        events += parser.feed(text[pos : pos + n])
        pos += n
    events += parser.feed(text[pos:])
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = [e.call for e in events if isinstance(e, CallDelta)]
    # the expected call written out, not the whole-text parse (which runs the same parser)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("browser_open", {"url": "https://a.b", "tab": 1})
    ]
    assert content == "Thinking <tool about it.\n\ntrailing <tool_c"
    # no content delta ever contained part of the call
    assert all("browser_open" not in e.text for e in events if isinstance(e, ContentDelta))
