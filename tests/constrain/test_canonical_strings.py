"""Both arguments backends write JSON strings with only the escapes json.dumps writes (the history
renders arguments with json.dumps / tojson, ensure_ascii=False): no \\/ and no \\uXXXX for a
printable character, while UTF-8 text and the usual escapes pass."""

from __future__ import annotations

import json

import pytest

from .test_constraint import feed, plan

TOOLS = [
    {"type": "function", "function": {"name": "shell_exec", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}},
]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (json.dumps('ä "q" \\ /\n\t', ensure_ascii=False), True),
        ('"a\\/b"', False),
        ('"\\u00e4"', False),
    ],
)
def test_string_escapes_are_those_of_json_dumps(factory, tokenizer, hermes, value, ok) -> None:
    p = plan(TOOLS, "required", hermes)
    constraint = factory.build(TOOLS, p, [tokenizer.eos_token_id])
    text = hermes.render_calls([("shell_exec", '{"cmd": ' + value + "}", "")])
    assert text.startswith(p.prefill)
    assert feed(constraint, tokenizer, text[len(p.prefill) :]) == ok
