"""Custom tools: random logits under the grammar mask always give an input the grammar accepts, and
the envelope's text gives that input back exactly (JSON string in hermes, raw XML in qwen3_coder)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.chat.tool_choice import plan_tools
from server.chat.toolcalls import StreamingToolCallParser
from server.constrain.custom.encoding import ESCAPES, XML_END
from server.constrain.custom.grammar import check_format
from server.constrain.custom.matcher import CustomMatcher
from server.constrain.envelope_compiler import EnvelopeCompiler
from server.constrain.errors import ConstraintError
from server.constrain.vocab import TokenVocab
from server.custom_tools import custom_input, normalize_request
from server.families.envelope import load_envelope
from tests.constrain.custom_grammars import (
    CALC_LARK,
    TRICKY_REGEX,
    apply_patch_lark,
    apply_patch_ok,
    calc_ok,
    tricky_ok,
)

EOS = 2
GRAMMARS = {
    "apply_patch": ("lark", apply_patch_lark(), apply_patch_ok),
    "calc": ("lark", CALC_LARK, calc_ok),
    "tricky": ("regex", TRICKY_REGEX, tricky_ok),
}
# ways to finish an input begun at random (tried in order once the random steps are spent)
_PATCH_ENDS = [
    p + e
    for p in ("", "\n", "\n+x\n", "+x\n", "\n x\n", " x\n")
    for e in ("*** End Patch", "*** End Patch\n")
]
ENDINGS = {
    "apply_patch": _PATCH_ENDS,
    "calc": [p + ")" * k for k in range(100) for p in ("", "1", "(1")],  # random walks nest deeply
    "tricky": ["", "a"],
}
SETTINGS = dict(derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def custom_tool(name: str) -> dict:
    syntax, definition, _ = GRAMMARS[name]
    body = {
        "type": "custom",
        "custom": {
            "name": name,
            "format": {"type": "grammar", "grammar": {"syntax": syntax, "definition": definition}},
        },
    }
    return normalize_request({"tools": [body]})["tools"][0]


@pytest.fixture(scope="module", params=["hermes", "qwen3_coder"])
def compiler(request, tokenizer):
    return EnvelopeCompiler(tokenizer, len(tokenizer), load_envelope(request.param))


def encode(text: str, envelope: str) -> str:
    """The input as the envelope writes it, up to its end (closing quote / end marker)."""
    if envelope == "qwen3_coder":
        return text + XML_END.decode()
    return json.dumps(text, ensure_ascii=False)[1:]


def decode_call(compiler, name: str, seed: int, random_steps: int) -> tuple[str, bool]:
    """Random logits under the mask for ``random_steps`` tokens, then the first ending the matcher
    takes (written as single-byte tokens, each checked against the mask). Returns (text, finished)."""
    tools = [custom_tool(name)]
    plan = plan_tools(
        tools, {"type": "function", "function": {"name": name}}, [], False, None, compiler.envelope
    )
    c = compiler.build(tools, plan, (EOS,))
    vocab: TokenVocab = compiler.vocab
    bitmask = np.zeros((1, vocab.words), dtype=np.int32)
    gen = torch.Generator().manual_seed(seed)
    out: list[int] = []
    single = {b: vocab.by_bytes[bytes([b])][0] for b in range(256) if bytes([b]) in vocab.by_bytes}
    for step in range(random_steps + 400):
        if c.is_terminated():
            break
        c.fill_next_token_bitmask(bitmask, 0)
        allowed = TokenVocab.unpack(bitmask[0], vocab.vocab_size)
        assert allowed, f"the mask allowed nothing after {vocab.token_bytes[out[-1]] if out else b''!r}"
        m = c.matcher
        if step >= random_steps and isinstance(m, CustomMatcher) and m.phase == 1:
            if _finish(c, m, name, compiler.envelope.name, bitmask, single, out):
                continue
        logits = torch.randn(vocab.vocab_size, generator=gen)
        ids = np.fromiter(allowed, dtype=np.int64)
        tok = int(ids[int(torch.argmax(logits[ids]))])
        assert c.accept_token(tok), (
            c.error,
            b"".join(vocab.token_bytes[t] for t in out),
            c.phase,
            m and m.phase,
        )
        out.append(tok)
    text = plan.prefill + b"".join(vocab.token_bytes[t] for t in out).decode("utf-8")
    return text, c.is_terminated()


def _finish(c, m, name, envelope, bitmask, single, out) -> bool:
    """Write the first listed ending the matcher takes, byte by byte under the mask (False: none fits)."""
    rest = m.c.after[0].decode()
    for end in ENDINGS[name]:
        tail = (encode(end, envelope) + rest).encode()
        if not m._feed(tail, commit=False):
            continue
        for b in tail:
            c.fill_next_token_bitmask(bitmask, 0)
            assert (int(bitmask[0][single[b] >> 5]) >> (single[b] & 31)) & 1, (end, bytes([b]))
            assert c.accept_token(single[b]), c.error
            out.append(single[b])
        return True
    return False


def recovered(compiler, name: str, text: str) -> str:
    parser = StreamingToolCallParser(compiler.envelope, [custom_tool(name)])
    parser.feed(text)
    parser.finish()
    calls = parser.result().tool_calls
    assert len(calls) == 1 and calls[0].name == name, text
    found = custom_input(calls[0].arguments)
    assert found is not None, calls[0].arguments
    return found


@pytest.mark.parametrize("name", list(GRAMMARS))
@settings(max_examples=12, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1), steps=st.integers(0, 60))
def test_random_logits_give_inputs_the_grammar_accepts(compiler, name, seed, steps):
    text, finished = decode_call(compiler, name, seed, steps)
    if not finished:  # no listed ending fitted where the random walk stopped: nothing to check
        return
    value = recovered(compiler, name, text)
    assert GRAMMARS[name][2](value), (value, text)
    # exact recovery: writing the input back in the envelope's encoding gives the model's text
    assert encode(value, compiler.envelope.name) in text


@pytest.mark.parametrize("name", list(GRAMMARS))
def test_most_random_walks_finish(compiler, name):
    """The property above is not vacuous: most random starts end in a complete, valid call."""
    done = 0
    for seed in range(6):
        text, finished = decode_call(compiler, name, seed, 30)
        if finished:
            assert GRAMMARS[name][2](recovered(compiler, name, text))
            done += 1
    assert done >= 4


@settings(max_examples=60, **SETTINGS)
@given(value=st.text(alphabet=st.sampled_from(list('abc"\\\n é\t€')), min_size=1, max_size=12))
def test_any_input_of_the_grammar_is_writable_and_round_trips(compiler, value):
    """Every input the grammar allows (quotes, backslashes, newlines, non-ASCII) can be written byte by
    byte under the mask, and the parser gives it back unchanged."""
    tools = [custom_tool("tricky")]
    plan = plan_tools(tools, "required", [], False, None, compiler.envelope)
    c = compiler.build(tools, plan, (EOS,))
    vocab = compiler.vocab
    body = {"hermes": '", "arguments": ', "qwen3_coder": ">\n"}[compiler.envelope.name]
    head = plan.prefill.split("tricky", 1)[1] if "tricky" in plan.prefill else None
    rest = ("tricky" if head is None else "") + body
    rest += {"hermes": '{"input": "', "qwen3_coder": "<parameter=input>\n"}[compiler.envelope.name]
    tail = encode(value, compiler.envelope.name) + c.compiled[0].after[0].decode()
    bitmask = np.zeros((1, vocab.words), dtype=np.int32)
    written = (rest + tail).encode()
    for i, b in enumerate(written):
        tid = vocab.by_bytes[bytes([b])][0]
        c.fill_next_token_bitmask(bitmask, 0)
        assert (int(bitmask[0][tid >> 5]) >> (tid & 31)) & 1, (value, written[: i + 1])
        assert c.accept_token(tid), c.error
    assert c.is_terminated() or c.phase.name == "AFTER"
    assert recovered(compiler, "tricky", plan.prefill + rest + tail) == value


def test_json_escapes_are_the_canonical_ones():
    assert ESCAPES[b"\\n"] == b"\n" and ESCAPES[b'\\"'] == b'"' and ESCAPES[b"\\u0001"] == b"\x01"
    assert b"\\/" not in ESCAPES  # json.dumps never writes it: the model may not either


@pytest.mark.parametrize(
    "fmt, needle",
    [
        ({"type": "grammar", "syntax": "lark", "definition": 'start: "a" nowhere'}, "nowhere"),
        ({"type": "grammar", "syntax": "regex", "definition": "(a"}, "unclosed"),
    ],
)
def test_bad_grammars_are_400s_with_the_compilers_message(fmt, needle):
    with pytest.raises(ConstraintError) as err:
        check_format(fmt, "tools[0].custom.format")
    assert err.value.param == "tools[0].custom.format" and needle in str(err.value)


def test_the_spec_json_carries_a_custom_tool_to_a_fresh_builder(tokenizer):
    """vLLM's processor builds from the spec's JSON form in its engine core: the format travels."""
    from server.constrain.compiler import Compiler
    from server.constrain.spec import ToolSpec

    tools = [custom_tool("tricky")]
    plan = plan_tools(tools, "required", [], False, None, load_envelope("hermes"))
    wire = json.loads(json.dumps(ToolSpec(tools, plan, eos_token_ids=(EOS,)).to_json()))
    c = Compiler(tokenizer, len(tokenizer)).build(ToolSpec.from_json(wire))
    assert c is not None
    c.accept_token(tokenizer.convert_tokens_to_ids('"'))  # name close begins
    for b in ', "arguments": {"input": "a\\n€"}}\n</tool_call>'.encode():
        tid = c.masks.vocab.by_bytes[bytes([b])][0]
        assert c.accept_token(tid), c.error
    assert c.is_terminated()


def test_front_door_shapes_become_function_forms():
    syntax, definition, _ = GRAMMARS["tricky"]
    fmt = {"type": "grammar", "grammar": {"syntax": syntax, "definition": definition}}
    body = {
        "tools": [{"type": "custom", "custom": {"name": "t", "description": "D", "format": fmt}}],
        "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "custom", "name": "t"}, {"type": "custom", "custom": {"name": "t"}}]}},
        "messages": [{"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "custom", "custom": {"name": "t", "input": 'a"\\\né'}}]}],
    }  # fmt: skip
    out = normalize_request(body)
    tool = out["tools"][0]
    assert tool["function"]["name"] == "t" and tool["function"]["description"].startswith("D\n\n")
    assert definition in tool["function"]["description"] and tool["custom_format"]["syntax"] == "regex"
    assert (
        out["tool_choice"]["allowed_tools"]["tools"] == [{"type": "function", "function": {"name": "t"}}] * 2
    )
    call = out["messages"][0]["tool_calls"][0]
    assert call == {
        "id": "c1",
        "type": "function",
        "function": {"name": "t", "arguments": '{"input": "a\\"\\\\\\né"}'},
    }
    assert custom_input(call["function"]["arguments"]) == 'a"\\\né'
    named = normalize_request({"tool_choice": {"type": "custom", "custom": {"name": "t"}}})
    assert named["tool_choice"] == {"type": "function", "function": {"name": "t"}}
    flat = normalize_request({"tools": [{"type": "custom", "custom": {"name": "u", "format": {
        "type": "grammar", "syntax": "lark", "definition": 'start: "x"'}}}]})  # fmt: skip
    assert flat["tools"][0]["custom_format"] == {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: "x"',
    }
    text = normalize_request({"tools": [{"type": "custom", "custom": {"name": "v"}}]})
    assert text["tools"][0]["custom_format"] == {"type": "text"}
