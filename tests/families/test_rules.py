"""A conversation the family cannot express is a 400 that says what and how to fix."""

from __future__ import annotations

import json

import pytest

from server.errors import InvalidRequest
from server.families.render import FamilyRenderer, call_id
from server.protocol import ChatMessage


def _msgs(*items: dict) -> list[ChatMessage]:
    return [ChatMessage(**m) for m in items]


def _call(cid: str | None, args: str = '{"a": 1}') -> dict:
    return {"id": cid, "type": "function", "function": {"name": "f", "arguments": args}}


@pytest.mark.parametrize("ref", ["mistral:v3", "mistral:v13"])
def test_mistral_tool_result_without_a_call(ref: str) -> None:
    msgs = _msgs(
        {"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "abcdefghi", "content": "r"}
    )
    with pytest.raises(InvalidRequest, match="no preceding assistant tool call.*add that assistant message"):
        FamilyRenderer(ref).render(msgs, [])


def test_mistral_call_id_rules() -> None:
    bad = _msgs({"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [_call("call_123")]})
    with pytest.raises(
        InvalidRequest, match=r"tool_calls\[0\]\.id is 'call_123'.*9 letters or digits"
    ) as exc:
        FamilyRenderer("mistral").render(bad, [])
    assert exc.value.param == "messages[1].tool_calls[0].id"
    wrong = _msgs(
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [_call("abcdefghi")]},
        {"role": "tool", "tool_call_id": "zzzzzzzzz", "content": "r"},
    )
    with pytest.raises(InvalidRequest, match="answers no call.*abcdefghi"):
        FamilyRenderer("mistral").render(wrong, [])
    good = _msgs(
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [_call("abcdefghi")]},
        {"role": "tool", "tool_call_id": "abcdefghi", "content": "r"},
    )
    assert "[TOOL_RESULTS]" in FamilyRenderer("mistral").render(good, []).text


def test_mistral_v3_cannot_write_text_and_calls_together_but_v13_can() -> None:
    msgs = _msgs(
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "ok", "tool_calls": [_call("abcdefghi")]},
    )
    with pytest.raises(InvalidRequest, match="both text content and tool_calls"):
        FamilyRenderer("mistral:v3").render(msgs, [])
    assert "ok[TOOL_CALLS]f[ARGS]" in FamilyRenderer("mistral:v13").render(msgs, []).text


def test_llama_arguments_must_be_an_object() -> None:
    msgs = _msgs(
        {"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [_call("c1", "[1, 2]")]}
    )
    with pytest.raises(InvalidRequest, match="not a JSON object"):
        FamilyRenderer("llama3_json").render(msgs, [])


def test_hermes_keeps_accepting_what_it_always_did() -> None:
    msgs = _msgs(
        {"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "whatever", "content": "r"}
    )
    assert "<tool_response>\nr\n</tool_response>" in FamilyRenderer("hermes").render(msgs, []).text


def test_call_ids_follow_the_family() -> None:
    mistral = call_id({"length": 9, "alphabet": "alnum"}, "chatcmpl-abc", 0)
    assert len(mistral) == 9 and mistral.isalnum()
    assert mistral != call_id({"length": 9}, "chatcmpl-abc", 1)
    assert call_id({}, "chatcmpl-0123456789abcdef", 2) == "call_456789abcdef_2"


def test_arguments_keep_the_clients_key_order_in_every_family() -> None:
    """Keys are never sorted (the vendors' templates keep the client's order); only the
    whitespace of the JSON text is the family's own."""
    a = _msgs(
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [_call("abcdefghi", '{"b":1,  "a":2}')]},
    )
    b = _msgs(
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [_call("abcdefghi", json.dumps({"b": 1, "a": 2}))]},
    )
    c = _msgs(
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [_call("abcdefghi", json.dumps({"a": 2, "b": 1}))]},
    )
    for ref in ("hermes", "llama3_json", "mistral:v3", "mistral:v13", "qwen3_coder"):
        r = FamilyRenderer(ref)
        text = r.render(a, []).text
        assert text == r.render(b, []).text
        assert text != r.render(c, []).text
        assert text.index("b") < text.rindex("a"), ref
