"""The streaming tool-call parser and the message merge are linear (issue 37 item 8): an argument that
holds the trigger text made every feed rescan the whole call (8,000 tokens: 12.5 s of event-loop
time), and merging 4,096 same-role messages re-joined the run at each step (14.9 s)."""

from __future__ import annotations

import json
import time

import pytest

from server.chat.toolcalls import StreamingToolCallParser
from server.families.envelope import load_envelope

N = 8_000


def _stream(envelope_name: str, text: str, step: int = 4) -> tuple[StreamingToolCallParser, float]:
    parser = StreamingToolCallParser(load_envelope(envelope_name))
    t0 = time.perf_counter()
    for i in range(0, len(text), step):
        parser.feed(text[i : i + step])
    parser.finish()
    return parser, time.perf_counter() - t0


@pytest.mark.parametrize("envelope", ["mistral_name_args", "mistral_json_array"])
def test_a_long_argument_holding_the_trigger_streams_in_linear_time(envelope):
    value = "see [TOOL_CALLS] here; " * (N * 4 // 23)  # ~N tokens of 4 characters
    if envelope == "mistral_name_args":
        text = "[TOOL_CALLS]write[ARGS]" + json.dumps({"text": value})
    else:
        text = "[TOOL_CALLS][" + json.dumps({"name": "write", "arguments": {"text": value}}) + "]"
    parser, took = _stream(envelope, text)
    assert took < 2.0, f"{took:.1f} s for {len(text) // 4} feeds"
    (call,) = parser.result().tool_calls
    assert call.name == "write" and json.loads(call.arguments)["text"] == value


def test_a_trigger_outside_the_strings_still_ends_an_unfinished_call():
    parser, _ = _stream(
        "mistral_name_args", '[TOOL_CALLS]a[ARGS]{"x": "[TOOL_CALLS]", [TOOL_CALLS]b[ARGS]{"y": 1}'
    )
    out = parser.result()
    assert [c.name for c in out.tool_calls] == ["b"] and out.content.startswith("[TOOL_CALLS]a[ARGS]")


def test_a_tagged_call_whose_argument_holds_the_close_tag_is_parsed_once_per_candidate():
    value = "</tool_call> " * (N // 3)
    text = "<tool_call>\n" + json.dumps({"name": "write", "arguments": {"text": value}}) + "\n</tool_call>"
    parser, took = _stream("hermes", text)
    assert took < 2.0, f"{took:.1f} s"
    (call,) = parser.result().tool_calls
    assert json.loads(call.arguments)["text"] == value


def test_merging_thousands_of_same_role_messages_is_linear():
    from server.families.conversation import Msg, normalise
    from server.families.family import load_family

    family = load_family("mistral")
    assert "user" in family.layout.merge_consecutive
    msgs = [Msg(i, "user", f"message {i} " + "x" * 200) for i in range(4096)]
    t0 = time.perf_counter()
    merged, _ = normalise(family, msgs, has_tools=False)
    assert time.perf_counter() - t0 < 1.0
    users = [m for m in merged if m.role == "user"]
    assert len(users) == 1 and users[0].content == family.layout.merge_separator.join(m.content for m in msgs)
    assert users[0].index == 0
