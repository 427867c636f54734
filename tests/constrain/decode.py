"""Test helpers: greedy decoding under a constraint, and parsing Hermes calls back."""

from __future__ import annotations

import json
import re

import torch
import xgrammar as xgr

EOS = (2, 0)
CALL_RE = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)


def greedy(constraint, vocab_size: int, steps: int, logits_fn) -> tuple[list[int], bool]:
    """Decode greedily: logits_fn(step, phase) -> logits [V]; returns (ids, finished cleanly)."""
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    out: list[int] = []
    for step in range(steps):
        if constraint.is_terminated():
            return out, True
        constraint.fill_next_token_bitmask(bitmask, 0)
        logits = logits_fn(step, constraint).unsqueeze(0)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        tok = int(logits.argmax())
        assert torch.isfinite(logits[0, tok]), "the mask allowed nothing"
        assert constraint.accept_token(tok), constraint.error
        out.append(tok)
        if tok in EOS:
            return out, True
    return out, constraint.is_terminated()


def parse_calls(text: str) -> list[dict]:
    """Hermes calls in the text, each {"name", "arguments"}; raises if a block is not JSON."""
    return [json.loads(block) for block in CALL_RE.findall(text)]


def strip_eos(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode([i for i in ids if i not in EOS])
