"""Walks through the masks of a sectioned envelope (Kimi K2, DeepSeek V3.1) on the family's test
vocabulary: what the masks let a model write, as text with its special tokens. Shared by the mask
tests (tests/constrain/test_section_masks.py) and the vLLM parser round trip
(tests/engines/vllm/test_section_parsers_vllm.py, in the vllm venv).

* ``random_walk``: a seeded random choice among the allowed tokens at every step;
* ``guided_walk``: the text a model would write for chosen calls (``Envelope.render_calls``), as the
  tokenizer encodes it: the masks must allow every token, so the walk proves they let exactly that
  text through.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from server.constrain.envelope_compiler import EnvelopeCompiler
from server.constrain.plan import ReasoningPlan, ToolPlan
from server.families.envelope import Envelope, load_envelope
from server.families.family import load_family
from server.families.test_model import family_test_tokenizer

QUOTED = {"cmd": 'echo "hi" \'there\'\nprintf "a\\tb"', "note": "naïve café — 東京 👋"}
SHELL = {
    "type": "function",
    "function": {
        "name": "shell_exec",
        "description": "Run a command.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}, "note": {"type": "string"}},
            "required": ["cmd"],
        },
    },
}
LS = {
    "type": "function",
    "function": {
        "name": "shell_ls",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "enum": ["/", "/tmp"]}},
            "required": ["path"],
        },
    },
}
EXIT = {
    "type": "function",
    "function": {"name": "shell_exit", "parameters": {"type": "object", "properties": {}}},
}
TOOLS = [SHELL, LS, EXIT]


@cache
def setup(ref: str) -> tuple[Any, Envelope, EnvelopeCompiler]:
    tok = family_test_tokenizer(ref)
    env = load_envelope(load_family(ref).envelope)
    comp = EnvelopeCompiler(tok, len(tok), env)
    return tok, env, comp


def plan(
    ref: str,
    mode: str,
    allowed: tuple[str, ...],
    parallel: bool = True,
    prefix: str = "",
    budget: int | None = None,
    first: int = 0,
) -> ToolPlan:
    """``prefix``: the start of the allowed names the prefill holds (required / named modes);
    ``first``: the calls the conversation already holds (Kimi's call ids go on from there)."""
    _, env, _ = setup(ref)
    prefill = env.opening + prefix if mode in ("required", "named") else ""
    r = load_family(ref).reasoning
    think = ReasoningPlan(r.open, r.close, budget, trim=r.trim) if r is not None else None
    return ToolPlan(mode, allowed, parallel, prefill, None, think, first_call_index=first)  # type: ignore[arg-type]


def _allowed(comp: EnvelopeCompiler, c: Any, n: int) -> np.ndarray:
    bm = np.zeros((1, comp.vocab.words), dtype=np.int32)
    c.fill_next_token_bitmask(bm, 0)
    return np.flatnonzero(np.unpackbits(bm[0].view(np.uint8), bitorder="little")[:n])


def random_walk(ref: str, p: ToolPlan, seed: int, steps: int = 300, max_tokens: int | None = None) -> str:
    """The text the masks let a random model write (the prompt's prefill first, the end token left out)."""
    tok, env, comp = setup(ref)
    eos = tuple(tok.convert_tokens_to_ids(t) for t in env.end_tokens)
    c = comp.build(TOOLS, p, eos, budget=max_tokens)
    assert c is not None
    rng = np.random.default_rng(seed)
    special = set(comp.vocab.special_ids)
    out: list[int] = []
    for _ in range(max_tokens or steps):
        ids = _allowed(comp, c, len(tok))
        marks = [i for i in ids if int(i) in special and int(i) not in eos]
        t = int(rng.choice(marks if marks and rng.random() < 0.4 else ids))  # markers often: calls finish
        assert c.accept_token(t), c.error
        if t in eos:
            break
        out.append(t)
        if c.is_terminated():
            break
    return _head(p) + str(tok.decode(out, skip_special_tokens=False))


def _head(p: ToolPlan) -> str:
    """The prefill, in the prompt before the reply (with reasoning the gate forces it after the close)."""
    return p.prefill if p.reasoning is None else ""


def guided_walk(
    ref: str, p: ToolPlan, target: str, max_tokens: int | None = None, budget: int | None = None
) -> str:
    """``target`` (what follows the prompt) written under the masks as the tokenizer encodes it
    (the special tokens as themselves), every token checked against the mask; up to ``max_tokens``
    tokens (a reply cut there); ``budget``: the request's max_tokens as the masks know it."""
    tok, env, comp = setup(ref)
    eos = tuple(tok.convert_tokens_to_ids(t) for t in env.end_tokens)
    c = comp.build(TOOLS, p, eos, budget=budget)
    assert c is not None
    ids = list(tok(target, add_special_tokens=False)["input_ids"])[:max_tokens]
    for k, tid in enumerate(ids):
        ok = set(_allowed(comp, c, len(tok)).tolist())
        seen = tok.decode(ids[:k], skip_special_tokens=False)
        assert tid in ok, f"the masks refuse {tok.convert_ids_to_tokens(tid)!r} after {seen[-60:]!r}"
        assert c.accept_token(tid), c.error
    if max_tokens is None or len(ids) < max_tokens:
        assert c.is_terminated() or set(_allowed(comp, c, len(tok)).tolist()) <= set(eos), "more was allowed"
    return str(tok.decode(ids, skip_special_tokens=False))
