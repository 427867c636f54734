"""Both arguments backends write JSON strings with only the escapes json.dumps writes (the history
renders arguments with json.dumps / tojson, ensure_ascii=False): no \\/ and no \\uXXXX for a
printable character, while UTF-8 text and the usual escapes pass."""

from __future__ import annotations

import json

import pytest

from .test_tool_matcher import feed, plan

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
def test_string_escapes_are_those_of_json_dumps(compiler, tokenizer, hermes, value, ok) -> None:
    p = plan(TOOLS, "required", hermes)
    constraint = compiler.build(TOOLS, p, [tokenizer.eos_token_id])
    text = hermes.render_calls([("shell_exec", '{"cmd": ' + value + "}", "")])
    assert text.startswith(p.prefill)
    assert feed(constraint, tokenizer, text[len(p.prefill) :]) == ok


NUMBER_TOOLS = [
    {"type": "function", "function": {"name": "set_value", "parameters": {
        "type": "object", "properties": {"v": {"type": "number"}}, "required": ["v"]}}},
]  # fmt: skip


@pytest.mark.parametrize(
    "value",
    ["0", "-1", "10", "123456789012345678901234567890", "1.5", "1.0", "-0.0", "0.05", "-2.25",
     "100000.0", "1.1",
     # forms the history writes differently (json.dumps(json.loads(v)) != v)
     "1.50", "1e5", "1E+2", "2.0e-3", "-0", "0.10", "1.00"],
)  # fmt: skip
def test_numbers_are_written_as_the_history_renders_them(compiler, tokenizer, hermes, value) -> None:
    """Every family's history parses the arguments and writes them back as json.dumps does: the
    masks allow a number only in that form, so the model's bytes are the next prompt's."""
    p = plan(NUMBER_TOOLS, "required", hermes)
    constraint = compiler.build(NUMBER_TOOLS, p, [tokenizer.eos_token_id])
    text = hermes.render_calls([("set_value", '{"v": ' + value + "}", "")])
    round_trips = json.dumps(json.loads(value)) == value
    assert feed(constraint, tokenizer, text[len(p.prefill) :]) == round_trips


@pytest.mark.parametrize(
    "value", ["0", "-1", "10", "1.5", "1.0", "-0.0", "0.05", "100000.0", "1.50", "1e5", "-0", "0.10", "2E-3"]
)
def test_qwen3_coder_numbers_are_written_as_the_history_renders_them(value) -> None:
    """Qwen3-Coder's <parameter=K> values: the history writes ``str`` of the parsed value."""
    import re

    from server.constrain.arguments.xml import INT_RE, NUM_RE

    parsed = json.loads(value)
    assert bool(re.fullmatch(NUM_RE, value)) == (str(parsed) == value)
    if isinstance(parsed, int):
        assert bool(re.fullmatch(INT_RE, value)) == (str(parsed) == value)
