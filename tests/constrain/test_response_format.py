"""response_format (JSON text) and strict tools through the masking core, on both arguments backends."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import xgrammar as xgr

from server.chat.tool_choice import ToolPlan, plan_tools
from server.constrain.compiler import Compiler
from server.constrain.errors import ConstraintError
from server.constrain.response_format import JsonTextMatcher, json_text_matcher, text_schema
from server.constrain.spec import ToolSpec
from server.constrain.vocab import TokenVocab

from .decode import EOS, parse_calls

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
STRICT_TOOL = {
    "type": "function",
    "function": {
        "name": "set_user",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 1, "maximum": 99},
                "mode": {"enum": ["r", "w"]},
                "note": {"type": "string", "maxLength": 6},
            },
            "required": ["id", "mode", "note"],
            "additionalProperties": False,
        },
    },
}


def plan(tools, choice, hermes, parallel=False):
    return plan_tools(tools, choice, [{"role": "user", "content": "hi"}], parallel, None, hermes)


def allowed(constraint, vocab_size: int) -> list[int]:
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    constraint.fill_next_token_bitmask(bitmask, 0)
    return sorted(TokenVocab.unpack(bitmask[0].numpy(), vocab_size))


def random_walk(constraint, vocab_size: int, rng: random.Random, steps: int = 200) -> list[int]:
    """Sample uniformly among the allowed tokens until the constraint ends (or EOS)."""
    out: list[int] = []
    for _ in range(steps):
        if constraint.is_terminated():
            break
        ids = allowed(constraint, vocab_size)
        assert ids, "the mask allowed nothing"
        tid = rng.choice(ids)
        assert constraint.accept_token(tid), constraint.error
        if tid in EOS:
            break
        out.append(tid)
    return out


def json_only(compiler, schema, tools=None, choice=None, hermes=None):
    tools_c = compiler.build(tools, plan(tools, choice, hermes), EOS) if tools else None
    return json_text_matcher(compiler.masks, compiler.backend, schema, EOS, tools_c)


def test_text_schema_forms():
    assert text_schema("text", None) is None
    assert text_schema("json_object", None) == {"type": "object"}
    assert text_schema("json_schema", {"name": "p", "schema": PERSON}) == PERSON
    assert text_schema("json_schema", {"name": "p"}) == {"type": "object"}
    for js, param in [
        (None, "response_format.json_schema"),
        ({"schema": PERSON}, "response_format.json_schema.name"),
        ({"name": "p", "schema": {"type": "bogus"}}, "response_format.json_schema.schema"),
        (
            {"name": "p", "schema": {"properties": {"a": {"minimum": "x"}}}},
            "response_format.json_schema.schema",
        ),
        ({"name": "p", "schema": "{}"}, "response_format.json_schema.schema"),
    ]:
        with pytest.raises(ConstraintError) as err:
            text_schema("json_schema", js)
        assert err.value.param == param


def test_twenty_random_json_replies_validate(compiler, tokenizer, hermes):
    """Uniformly random tokens among the allowed ones: every reply is JSON that follows the schema."""
    vocab_size = len(tokenizer)
    for seed in range(20):
        c = json_only(compiler, PERSON, hermes=hermes)
        ids = random_walk(c, vocab_size, random.Random(seed))
        assert c.is_terminated() and c.error is None
        jsonschema.validate(json.loads(tokenizer.decode(ids)), PERSON)


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
def test_json_object_any_object(compiler, tokenizer, hermes):
    c = json_only(compiler, {"type": "object"}, hermes=hermes)
    first = allowed(c, len(tokenizer))
    assert all(tokenizer.decode([t]).startswith("{") for t in first)  # no text, no EOS before the JSON
    text = '{"a": [1, {"b": null}], "c": "x"}'
    for tid in tokenizer.encode(text):
        assert c.accept_token(tid), c.error
    assert set(allowed(c, len(tokenizer))) == set(EOS)  # the object is closed: only end of sequence
    assert c.accept_token(EOS[0]) and c.is_terminated()


def test_eos_before_the_json_is_complete_is_rejected(compiler, tokenizer, hermes):
    c = json_only(compiler, PERSON, hermes=hermes)
    for tid in tokenizer.encode('{"name": "ab"'):
        assert c.accept_token(tid), c.error
    assert EOS[0] not in allowed(c, len(tokenizer))
    assert not c.accept_token(EOS[0]) and "before the JSON reply" in c.error


def test_call_tag_is_banned_inside_json_strings(compiler, tokenizer, swe_tools, hermes):
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    for tools, choice in [(None, None), (swe_tools, "none")]:
        c = json_only(compiler, schema, tools, choice, hermes)
        assert isinstance(c, JsonTextMatcher) and c.call_row is None
        for tid in tokenizer.encode('{"s": "<tool_call'):
            assert c.accept_token(tid), c.error
        closing = [t for t in allowed(c, len(tokenizer)) if tokenizer.decode([t]).startswith(">")]
        assert not closing  # '>' would complete <tool_call> inside the string


def test_auto_first_token_chooses_call_or_json(compiler, tokenizer, swe_tools, hermes):
    vocab_size = len(tokenizer)
    c = json_only(compiler, PERSON, swe_tools, "auto", hermes)
    first = {tokenizer.decode([t]) for t in allowed(c, vocab_size)}
    assert "{" in first or '{"' in first
    assert any(t.startswith("<") for t in first)  # the call tag
    call = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    for tid in tokenizer.encode(call):
        assert c.accept_token(tid), c.error
    assert c.delegate and c.is_terminated()
    assert parse_calls(call)[0]["name"] == "bash"
    c = json_only(compiler, PERSON, swe_tools, "auto", hermes)
    for tid in tokenizer.encode('{"name": "x", "age": 3, "role": "user"}'):
        assert c.accept_token(tid), c.error
    assert not c.delegate and set(allowed(c, vocab_size)) == set(EOS)


def test_required_calls_ignore_the_text_schema(compiler, swe_tools, hermes):
    inner = compiler.build(swe_tools, plan(swe_tools, "required", hermes), EOS)
    assert json_text_matcher(compiler.masks, compiler.backend, PERSON, EOS, inner) is inner


def test_unenforceable_schema_is_a_400(compiler):
    with pytest.raises(ConstraintError) as err:
        json_text_matcher(compiler.masks, compiler.backend, {"type": "object", "$ref": "#/nope"}, EOS)
    assert err.value.param == "response_format.json_schema.schema"


def test_spec_carries_the_text_schema(tokenizer, hermes):
    spec = ToolSpec([], ToolPlan("none", (), False, "", None), "hermes", "xgrammar", EOS, text_schema=PERSON)
    again = ToolSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert again == spec and again.text_schema == PERSON
    with pytest.raises(ValueError, match="text_schema must be a JSON schema object"):
        ToolSpec.from_json({**spec.to_json(), "text_schema": "x"})
    built = Compiler(tokenizer, len(tokenizer), EOS).build(again)
    assert isinstance(built, JsonTextMatcher)


def test_strict_tool_arguments_follow_the_schema_exactly(compiler, tokenizer, hermes):
    """strict: true — every sampled call has exactly the schema's keys, typed and bounded."""
    tools = [STRICT_TOOL]
    schema = STRICT_TOOL["function"]["parameters"]
    for seed in range(10):
        c = compiler.build(tools, plan(tools, "required", hermes), EOS)
        p = plan(tools, "required", hermes)
        ids = random_walk(c, len(tokenizer), random.Random(seed))
        (call,) = parse_calls(p.prefill + tokenizer.decode(ids))
        assert call["name"] == "set_user"
        jsonschema.validate(call["arguments"], schema)
        assert set(call["arguments"]) == {"id", "mode", "note"}


def test_tools_without_additional_properties_get_no_extra_keys(compiler, tokenizer, hermes):
    """Without strict (no additionalProperties): still only the schema's properties are written."""
    fn = {**STRICT_TOOL["function"], "strict": False}
    fn["parameters"] = {k: v for k, v in fn["parameters"].items() if k != "additionalProperties"}
    fn["parameters"]["required"] = ["id"]
    tools = [{"type": "function", "function": fn}]
    for seed in range(10):
        c = compiler.build(tools, plan(tools, "required", hermes), EOS)
        ids = random_walk(c, len(tokenizer), random.Random(seed))
        (call,) = parse_calls(plan(tools, "required", hermes).prefill + tokenizer.decode(ids))
        assert set(call["arguments"]) <= {"id", "mode", "note"} and "id" in call["arguments"]
