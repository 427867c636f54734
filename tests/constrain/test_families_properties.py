"""Property tests per envelope on its family's real vocabulary: random logits, every mode, subsets.

Whatever the logits, the reply parses with the family's own parser (``parse_tool_calls`` with
the envelope) as calls to allowed tools whose arguments validate against the tool's schema,
or as text where the mode allows it; mode none never yields a call. Random logits get a bias
toward closing tokens that grows with the step, and a push toward the call's opening in the
text phase (``eager``), so that calls do get written within the step budget.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
import xgrammar as xgr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.chat.tool_choice import plan_tools
from server.chat.toolcalls import parse_tool_calls
from server.constrain.arguments.seam import tool_schema
from server.constrain.tool_matcher import Phase
from server.families.envelope import load_envelope

from .conftest import FAMILIES, load_tools

RICH = {
    "type": "function",
    "function": {
        "name": "config_set",
        "parameters": {
            "type": "object",
            "properties": {
                "opts": {
                    "type": "object",
                    "properties": {"depth": {"type": "integer"}},
                    "required": ["depth"],
                },
                "tags": {"type": "array", "items": {"type": "string"}},
                "ratio": {"type": "number"},
                "force": {"type": "boolean"},
                "mode": {"type": "string", "enum": ["fast", "safe"]},
            },
            "required": ["mode", "force"],
        },
    },
}
TOOLS = [
    t for t in load_tools("prefixed_agent_tools.json") if not t["function"]["name"].startswith("browser_s")
] + [RICH]
NAMES = tuple(t["function"]["name"] for t in TOOLS)
SCHEMAS = {t["function"]["name"]: tool_schema(t) for t in TOOLS}
FORMS = ("none", "auto", "required", "named", "subset_required", "subset_auto")
CLOSERS = ['"', '"}', "}}", "}", '",', ",", "]", '"}]', "\n", "</", "parameter", ">\n", "</function>"]
SEQUENCES = ["\n</parameter>\n", "</function>\n</tool_call>"]  # Qwen3-Coder's closers
STEPS = 96


def choice_for(form: str, subset: list[str]):
    if form in ("none", "auto", "required"):
        return form
    if form == "named":
        return {"type": "function", "function": {"name": subset[0]}}
    entries = [{"type": "function", "function": {"name": n}} for n in subset]
    return {"type": "allowed_tools", "allowed_tools": {"mode": form.split("_")[1], "tools": entries}}


def greedy(constraint, vocab_size: int, steps: int, logits_fn, eos) -> tuple[list[int], bool]:
    """Greedy decoding under the constraint; (ids, finished cleanly)."""
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    out: list[int] = []
    for step in range(steps):
        if constraint.is_terminated():
            return out, True
        constraint.fill_next_token_bitmask(bitmask, 0)
        logits = logits_fn(step, constraint, out).unsqueeze(0)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        tok = int(logits.argmax())
        assert torch.isfinite(logits[0, tok]), "the mask allowed nothing"
        assert constraint.accept_token(tok), constraint.error
        out.append(tok)
        if tok in eos:
            return out, True
    return out, constraint.is_terminated()


def _ids(off, text: str) -> list[int]:
    """``text`` as one token when the vocabulary has it (a SentencePiece tokenizer would encode it
    with a "▁" in front), else its tokenization."""
    exact = off.vocab.by_bytes.get(text.encode())
    return [exact[0]] if exact else off.tokenizer.encode(text, add_special_tokens=False)


class Biased:
    """Random logits plus a bias toward closing tokens (growing with the step) and the opening."""

    def __init__(self, off, envelope, eos: tuple[int, ...], seed: int, eager: bool) -> None:
        tok = off.tokenizer
        self.gen = torch.Generator().manual_seed(seed)
        self.v = off.vocab.vocab_size
        seqs = [_ids(off, s) for s in CLOSERS + SEQUENCES]
        self.strong = torch.tensor(sorted({ids[0] for ids in seqs} | set(eos)))
        self.follow = {tuple(ids[:k]): ids[k] for ids in seqs for k in range(1, len(ids))}
        self.weak = torch.tensor(sorted({_ids(off, d)[0] for d in "0123456789"}))
        self.opening = tok.encode(envelope.opening, add_special_tokens=False)
        self.eager = eager

    def __call__(self, step: int, constraint, out: list[int]) -> torch.Tensor:
        logits = torch.randn(self.v, generator=self.gen)
        logits[self.strong] += 0.45 * step
        for k in (3, 2, 1):  # go on with a closing sequence once it has begun
            nxt = self.follow.get(tuple(out[-k:])) if len(out) >= k else None
            if nxt is not None:
                logits[nxt] += 0.5 * step
                break
        logits[self.weak] += 0.2 * step
        if self.eager and constraint.phase == Phase.TEXT and step < 4:
            logits[self.opening[0]] += 60.0
        return logits


def run_case(off, env_name, form, subset, parallel, seed, eager):
    env = load_envelope(env_name)
    compiler = off.compiler(env_name)
    eos = off.eos(env_name)
    plan = plan_tools(TOOLS, choice_for(form, subset), [], parallel, None, env)
    constraint = compiler.build(TOOLS, plan, eos)
    steer = Biased(off, env, eos, seed, eager)
    ids, finished = greedy(constraint, off.vocab.vocab_size, STEPS, steer, eos)
    text = plan.prefill + off.tokenizer.decode([i for i in ids if i not in eos], skip_special_tokens=False)
    return env, plan, constraint, text, finished


def check(env, plan, constraint, text: str, finished: bool) -> None:
    assert constraint.error is None, constraint.error
    parser_out = parse_tool_calls(text, env, TOOLS)
    calls = parser_out.tool_calls
    if plan.mode == "none":
        assert not calls and not constraint.calls
        return
    for call in calls:
        assert call.name in plan.allowed, (call.name, plan.allowed)
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        if env.call_id:  # an id the model writes (Mistral v3, v11): the parser returns it whole
            assert call.id is not None and re.fullmatch(env.call_id, call.id), (call.id, text)
    names = [c.name for c in calls]
    if finished:
        assert names == constraint.calls, (text, names, constraint.calls)
        if plan.mode == "required":
            assert calls
        if calls:  # nothing of the envelope leaks into the content
            content = parser_out.content or ""
            for marker in (env.call_tag, env.trigger_token, '{"name"', "</tool_call>", "<function="):
                assert not marker or marker not in content, (marker, content)
    else:
        assert names == constraint.calls[: len(names)]
    assert env.parallel and plan.parallel or len(calls) <= 1


@pytest.mark.parametrize("env_name", list(FAMILIES))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    form=st.sampled_from(FORMS),
    subset=st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True),
    parallel=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    eager=st.booleans(),
)
def test_random_logits_always_parse_as_allowed_valid_calls(
    official, env_name, form, subset, parallel, seed, eager
):
    off = official(FAMILIES[env_name][0])
    env, plan, constraint, text, finished = run_case(off, env_name, form, subset, parallel, seed, eager)
    check(env, plan, constraint, text, finished)


@pytest.mark.parametrize("env_name", list(FAMILIES))
def test_most_runs_write_a_complete_call(official, env_name):
    off = official(FAMILIES[env_name][0])
    done = 0
    for seed in range(12):
        form = FORMS[2 + seed % 4]  # the forms that must or may call a tool
        subset = [NAMES[(3 * seed) % len(NAMES)]]
        env, plan, constraint, text, finished = run_case(off, env_name, form, subset, False, seed, True)
        check(env, plan, constraint, text, finished)
        done += finished and bool(constraint.calls)
    assert done >= 8, f"only {done}/12 runs wrote a complete call"
