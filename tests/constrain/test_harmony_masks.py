"""Harmony (gpt-oss) masks on the Harmony test vocabulary (SmolLM2's + the Harmony special tokens;
the o200k vocabulary cannot be fetched here).

Random walks through the masks (seeded) give: ``<|channel|>analysis<|message|>``, free analysis,
the close ``<|end|><|start|>assistant`` (a special token ends it; the rest is forced), then
``required`` / named: ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`` and
arguments following the schema; ``none``: ``<|channel|>final<|message|>`` and free text; ``auto``:
either, never anything else. What the walk wrote is what the reply parser reads back.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from server.chat.reasoning_reply import ReasoningSplitter
from server.chat.toolcalls import parse_tool_calls
from server.constrain.envelope_compiler import EnvelopeCompiler
from server.constrain.plan import ReasoningPlan, ToolPlan
from server.families.envelope import load_envelope
from server.families.family import load_family
from server.families.test_model import family_test_tokenizer

FAMILY = load_family("harmony")
R = FAMILY.reasoning
ENV = load_envelope("harmony")
SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "enum": ["/", "/tmp"]}},
    "required": ["path"],
}
TOOLS = [
    {"type": "function", "function": {"name": "shell_ls", "parameters": SCHEMA}},
    {
        "type": "function",
        "function": {"name": "shell_exit", "parameters": {"type": "object", "properties": {}}},
    },
]
FINAL = "<|channel|>final<|message|>"
CALL = "<|channel|>commentary to=functions."


@pytest.fixture(scope="module")
def harmony():
    tok = family_test_tokenizer("harmony")
    return tok, EnvelopeCompiler(tok, len(tok), ENV)


def _walk(harmony, mode: str, allowed: tuple[str, ...], prefill: str, seed: int, budget: int = 4) -> str:
    tok, compiler = harmony
    assert R is not None
    plan = ToolPlan(
        mode, allowed, False, prefill, None, ReasoningPlan(R.open, R.close, budget, answer_open=R.answer_open)
    )  # type: ignore[arg-type]
    eos = tuple(tok.convert_tokens_to_ids(t) for t in ENV.end_tokens)
    return _run(harmony, compiler.build(TOOLS, plan, eos), eos, seed)


def _run(harmony, c, eos: tuple[int, ...], seed: int) -> str:
    """A seeded random walk through constraint ``c``'s masks: the text written (end token left out)."""
    tok, compiler = harmony
    rng = np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(80):
        bm = np.zeros((1, compiler.vocab.words), dtype=np.int32)
        c.fill_next_token_bitmask(bm, 0)
        allowed_ids = np.flatnonzero(np.unpackbits(bm[0].view(np.uint8), bitorder="little")[: len(tok)])
        t = int(rng.choice(allowed_ids))
        assert c.accept_token(t), c.error
        if t in eos:
            break
        out.append(t)
        if c.is_terminated():
            break
    return str(tok.decode(out, skip_special_tokens=False))


def _parse(text: str):
    assert R is not None
    s = ReasoningSplitter(ReasoningPlan(R.open, R.close, None, answer_open=R.answer_open))
    thought, answer = s.feed(text)
    t2, a2 = s.finish()
    return thought + t2, parse_tool_calls(answer + a2, ENV, TOOLS)


@pytest.mark.parametrize("seed", range(3))
def test_required_and_named_think_then_call(harmony, seed: int) -> None:
    for mode, allowed, prefill in (
        ("required", ("shell_ls", "shell_exit"), CALL),
        ("required", ("shell_ls",), CALL + "shell_ls"),
    ):
        text = _walk(harmony, mode, allowed, prefill, seed)
        assert text.startswith(R.open) and R.close + CALL in text, text
        thought, parsed = _parse(text)
        assert thought and "<|" not in thought
        assert len(parsed.tool_calls) == 1 and parsed.tool_calls[0].name in allowed, (text, parsed)
        if parsed.tool_calls[0].name == "shell_ls":
            jsonschema.validate(json.loads(parsed.tool_calls[0].arguments), SCHEMA)


@pytest.mark.parametrize("seed", range(4))
def test_none_answers_in_the_final_channel_and_auto_picks_one_way(harmony, seed: int) -> None:
    text = _walk(harmony, "none", (), "", seed)
    assert R.close + FINAL in text and CALL not in text, text
    thought, parsed = _parse(text)
    assert (
        not parsed.tool_calls and "<|" not in (parsed.content or "") and FINAL not in (parsed.content or "")
    )
    auto = _walk(harmony, "auto", ("shell_ls", "shell_exit"), "", seed)
    after = auto.split(R.close, 1)[1]
    assert after.startswith((FINAL, CALL)), auto
    _, parsed = _parse(auto)
    assert bool(parsed.tool_calls) == after.startswith(CALL)


def test_a_call_written_in_the_analysis_is_reasoning() -> None:
    text = R.open + "maybe " + CALL + "shell_ls <|constrain|>json<|message|>{}" + R.close + FINAL + "No call."
    thought, parsed = _parse(text)
    assert "functions.shell_ls" in thought and not parsed.tool_calls and parsed.content == "No call."


ANSWER = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["verdict"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", range(3))
def test_response_format_is_the_final_channel_after_the_analysis(harmony, seed: int) -> None:
    """response_format with Harmony: the analysis, the final channel's header, then JSON following
    the schema (the gate keeps the JSON constraint after the header; it once dropped it)."""
    from server.constrain.compiler import Compiler
    from server.constrain.spec import ToolSpec

    tok, compiler = harmony
    assert R is not None
    whole = Compiler(tok, len(tok))
    whole._vocab = compiler.vocab  # the session's vocabulary (built once)
    eos = tuple(tok.convert_tokens_to_ids(t) for t in ENV.end_tokens)
    plan = ToolPlan("auto", (), False, "", None, ReasoningPlan(R.open, R.close, 4, answer_open=R.answer_open))  # type: ignore[arg-type]
    c = whole.build(ToolSpec([], plan, "harmony", eos_token_ids=eos, text_schema=ANSWER))
    text = _run(harmony, c, eos, seed)
    assert R.close + FINAL in text, text
    thought, parsed = _parse(text)
    assert json.loads(parsed.content or "") in ({"verdict": "yes"}, {"verdict": "no"}), text
