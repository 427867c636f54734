from __future__ import annotations

import pytest

from server.errors import InvalidRequest
from server.families.defaults import DEFAULT_FAMILY
from server.families.family import load_family
from server.families.render import renderer_for
from server.protocol import ChatMessage

HERMES = renderer_for("hermes")
GENERATION_PROMPT = load_family(DEFAULT_FAMILY).layout.generation_prompt
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell_exec",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}, "cwd": {"type": "string"}},
            },
        },
    },
]


def msgs(*raw):
    return [ChatMessage.model_validate(m) for m in raw]


def test_the_clients_key_order_is_rendered_as_sent():
    """As the vendors' templates do: nothing sorted (a client that reorders keys between turns
    gets a cache miss, which the cache report names: tests/cache_diag)."""
    tools_a = [
        {
            "type": "function",
            "function": {
                "parameters": {
                    "properties": {"cwd": {"type": "string"}, "cmd": {"type": "string"}},
                    "type": "object",
                },
                "name": "shell_exec",
            },
        }
    ]
    m = msgs(
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "1", "function": {"name": "shell_exec", "arguments": '{"cwd": "/", "cmd": "ls"}'}}
            ],
        },
    )
    m2 = msgs(
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "2", "function": {"name": "shell_exec", "arguments": '{"cmd":"ls","cwd":"/"}'}}
            ],
        },
    )
    a = HERMES.render(m, TOOLS)
    b = HERMES.render(m2, tools_a)
    assert a.text != b.text
    assert '{"name": "shell_exec", "arguments": {"cwd": "/", "cmd": "ls"}}' in a.text
    assert '{"name": "shell_exec", "arguments": {"cmd": "ls", "cwd": "/"}}' in b.text
    assert '"properties": {"cwd": {"type": "string"}, "cmd": {"type": "string"}}, "type": "object"' in b.text


def test_hermes_layout_and_segments():
    r = HERMES.render(
        msgs(
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "go"},
            {"role": "tool", "content": "out1"},
            {"role": "tool", "content": "out2"},
        ),
        TOOLS,
    )
    assert r.text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert "<tools>\n{" in r.text and "</tools>" in r.text
    # consecutive tool results share one user turn
    assert (
        "<|im_start|>user\n<tool_response>\nout1\n</tool_response>\n<tool_response>\nout2\n</tool_response><|im_end|>"
        in r.text
    )
    assert r.text.endswith(GENERATION_PROMPT)
    labels = [s.label for s in r.segments]
    assert labels == [
        "system message",
        "tools block",
        "message 1 (user)",
        "message 2 (tool)",
        "message 3 (tool)",
    ]
    seg = r.segments[0]
    assert r.text[seg.start : seg.end] == "Be brief."
    assert r.tool_names == ("shell_exec",)


def test_appending_messages_only_appends_text():
    base = [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"}]
    a = HERMES.render(msgs(*base), TOOLS, add_generation_prompt=False)
    b = HERMES.render(
        msgs(*base, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}), TOOLS
    )
    assert b.text.startswith(a.text)


def test_default_system_message_when_none_given():
    r = HERMES.render(msgs({"role": "user", "content": "x"}), None)
    assert r.text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_non_text_content_part_is_refused():
    m = msgs({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})
    with pytest.raises(InvalidRequest, match="image_url"):
        HERMES.render(m, None)
