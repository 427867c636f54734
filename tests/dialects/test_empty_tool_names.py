"""Issue 36 item 9: a tool call with an empty name can never be emitted, in any dialect.

Two ways one could appear: a tool defined with an empty name (each dialect refuses it: a 400 naming
the tool) and a model that writes a call with an empty name (the parser keeps that text as text, in
every envelope, so no dialect ever converts it into a call)."""

from __future__ import annotations

import json

import pytest

from server.chat.toolcalls import parse_tool_calls
from server.dialects.messages.request import MessagesBody, convert
from server.dialects.responses.request import to_chat
from server.errors import InvalidRequest
from server.families.envelope import load_envelope
from server.protocol import ChatCompletionRequest

MODEL = "smollm2-135m-instruct"
TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
ENVELOPES = ["hermes", "llama3_json", "mistral_json_array", "mistral_name_args", "qwen3_coder"]


@pytest.mark.parametrize("name", ["", " "])
@pytest.mark.parametrize("envelope", ENVELOPES)
def test_a_written_call_with_an_empty_name_stays_text(envelope, name):
    env = load_envelope(envelope)
    text = env.render_calls([(name, json.dumps({"cmd": "ls"}), "id0000000")], "")
    out = parse_tool_calls(text, env, TOOLS)
    assert out.tool_calls == () and out.content, (envelope, text)  # kept as written, not a call
    good = env.render_calls([("shell", json.dumps({"cmd": "ls"}), "id0000000")], "")
    assert [c.name for c in parse_tool_calls(good, env, TOOLS).tool_calls] == ["shell"]  # the check can fail


def test_chat_refuses_a_tool_with_an_empty_name():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(Exception, match="name"):
        ChatCompletionRequest.model_validate({**body, "tools": [{"function": {"name": ""}}]})


def test_messages_refuses_a_tool_with_an_empty_name():
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "", "input_schema": {"type": "object"}}],
    }
    with pytest.raises(InvalidRequest) as exc:
        convert(MessagesBody.model_validate(body), body)
    assert exc.value.param == "tools[0].name"


@pytest.mark.parametrize(
    "tool",
    [{"type": "function", "name": "", "parameters": {"type": "object"}}, {"type": "custom", "name": ""}],
)
def test_responses_refuses_a_tool_with_an_empty_name(tool):
    with pytest.raises(InvalidRequest) as exc:
        to_chat({"model": MODEL, "input": "hi", "tools": [tool]})
    assert "non-empty" in exc.value.message
