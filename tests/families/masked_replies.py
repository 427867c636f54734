"""Replies written under a family's masks by random logits, for the parser round-trip tests.

``masked_reply`` builds the request's constraint as the chat service does (``plan_tools``, the
family's reasoning plan, ``EnvelopeCompiler.build`` with the ``max_tokens`` budget), then decodes
greedily from seeded random logits (biased toward the envelope's closing tags as the steps go on, and
toward the call tag early, so replies do reason, call and finish within the budget) and returns the
text the model wrote (its first token included, end-of-turn token excluded), whether it finished, the
calls the masks saw and the plan. Used by tests/families (our parser) and tests/engines/vllm (vLLM's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import torch
import xgrammar as xgr

from server.chat.reasoning_reply import choose_reasoning
from server.chat.tool_choice import plan_tools
from server.constrain.envelope_compiler import EnvelopeCompiler
from server.constrain.plan import ToolPlan
from server.constrain.reasoning_matcher import ReasoningPhase
from server.constrain.tool_matcher import Phase
from server.constrain.vocab import TokenVocab
from server.families.envelope import Envelope, load_envelope
from server.families.family import Family, load_family
from server.families.test_model import family_test_tokenizer

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "edit_file",
            "description": "Replace text in a file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "count": {"type": "integer"},
                    "dry_run": {"type": "boolean"},
                    "mode": {"type": "string", "enum": ["fast", "safe"]},
                    "opts": {"type": "object", "properties": {"ratio": {"type": "number"}}},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["path", "dry_run"],
            },
        },
    },
    {"type": "function", "function": {"name": "ls", "description": "List a folder.", "parameters": {}}},
    {
        "type": "function",
        "function": {
            "name": "ls_dir",
            "parameters": {"type": "object", "properties": {"dir": {"type": "string"}}, "required": ["dir"]},
        },
    },
]
NAMES = tuple(t["function"]["name"] for t in TOOLS)
FORMS = ("none", "auto", "required", "named", "allowed_required", "allowed_auto")
CLOSERS = ("</arg_value>", "</tool_call>", "</parameter>", "</invoke>", '"', "}", "]", "\n", "1", "true")


@dataclass(frozen=True)
class Reply:
    text: str  # what the model wrote (the forced tokens included), without the end-of-turn token
    finished: bool  # ended by an end-of-turn token or a terminated constraint (else cut by max_tokens)
    calls: tuple[str, ...]  # the calls the masks saw complete
    plan: ToolPlan
    error: str | None


class Official:
    """One family's test tokenizer, vocabulary and compiler (built once per family)."""

    def __init__(self, ref: str) -> None:
        self.family: Family = load_family(ref)
        self.envelope: Envelope = load_envelope(self.family.envelope)
        self.tokenizer = family_test_tokenizer(ref)
        self.vocab = TokenVocab.from_tokenizer(self.tokenizer, len(self.tokenizer))
        self.compiler = EnvelopeCompiler(self.tokenizer, len(self.tokenizer), self.envelope, vocab=self.vocab)
        self.eos = tuple(self.tokenizer.convert_tokens_to_ids(t) for t in self.family.test_model["eos"])
        ids = [self.tokenizer.encode(s, add_special_tokens=False) for s in CLOSERS]
        self.closers = torch.tensor(sorted({i[0] for i in ids} | set(self.eos)))
        self.follow = {tuple(i[:k]): i[k] for i in ids for k in range(1, len(i))}
        self.opening = self.tokenizer.encode(self.envelope.call_tag, add_special_tokens=False)[0]
        self.next_opening = self.tokenizer.encode(self.envelope.next_opening, add_special_tokens=False)[0]


@cache
def official(ref: str) -> Official:
    return Official(ref)


def tool_choice(form: str, subset: tuple[str, ...]) -> Any:
    if form in ("none", "auto", "required"):
        return form
    if form == "named":
        return {"type": "function", "function": {"name": subset[0]}}
    entries = [{"type": "function", "function": {"name": n}} for n in subset]
    mode = form.split("_")[1]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": entries}}


def masked_reply(
    ref: str,
    form: str,
    subset: tuple[str, ...],
    parallel: bool,
    seed: int,
    max_tokens: int = 160,
    reasoning_budget: int | None = 12,
) -> Reply:
    off = official(ref)
    plan = plan_tools(TOOLS, tool_choice(form, subset), [], parallel, None, off.envelope)
    choice = choose_reasoning(off.family.reasoning, None, reasoning_budget)
    plan = replace(plan, reasoning=choice.plan, lead=choice.lead)
    constraint = off.compiler.build(TOOLS, plan, off.eos, max_tokens)
    assert constraint is not None
    gen = torch.Generator().manual_seed(seed)
    bitmask = xgr.allocate_token_bitmask(1, off.vocab.vocab_size)
    out: list[int] = []
    finished = False
    for step in range(max_tokens):
        if constraint.is_terminated():
            finished = True
            break
        constraint.fill_next_token_bitmask(bitmask, 0)
        logits = torch.randn(off.vocab.vocab_size, generator=gen)
        logits[off.closers] += 0.35 * step
        for k in (3, 2, 1):  # go on with a closing tag once it has begun
            nxt = off.follow.get(tuple(out[-k:])) if len(out) >= k else None
            if nxt is not None:
                logits[nxt] += 0.5 * step
                break
        tools = getattr(constraint, "inner", constraint) if constraint.phase == ReasoningPhase.INNER else None
        phase = getattr(tools, "phase", None)
        if seed % 2 == 0 and phase in (Phase.TEXT, Phase.AFTER):  # toward a call (and another)
            logits[off.opening if phase == Phase.TEXT else off.next_opening] += max(0.0, 40.0 - 0.3 * step)
        logits = logits.unsqueeze(0)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        tok = int(logits.argmax())
        assert torch.isfinite(logits[0, tok]), "the mask allowed nothing"
        if not constraint.accept_token(tok):
            break
        if tok in off.eos:
            finished = True
            break
        out.append(tok)
    head = plan.prompt_prefill[len(plan.lead) :]  # a prefill in the prompt (none with reasoning: forced)
    text = head + off.tokenizer.decode(out, skip_special_tokens=False)
    inner = getattr(constraint, "inner", constraint)
    calls = tuple(getattr(inner, "calls", ()) or ())
    return Reply(text, finished, calls, plan, constraint.error)


def parse_reply(ref: str, text: str) -> tuple[str, str, list[tuple[str, str]], str | None]:
    """(reasoning, content, calls as (name, arguments JSON), unfinished call text) as our reply parser
    (the chat service's: reasoning split, then the envelope's tool-call parser) returns them."""
    from server.chat.reasoning_reply import ReasoningSplitter
    from server.chat.toolcalls import StreamingToolCallParser

    off = official(ref)
    plan = choose_reasoning(off.family.reasoning, None, None).plan
    assert plan is not None
    splitter = ReasoningSplitter(plan)
    _, answer = splitter.feed(text)
    _, rest = splitter.finish()
    parser = StreamingToolCallParser(off.envelope, TOOLS)
    parser.feed(answer + rest)
    parser.finish(unfinished_as_content=False)
    out = parser.result()
    calls = [(c.name, c.arguments) for c in out.tool_calls]
    return splitter.reasoning or "", out.content or "", calls, parser.unfinished
