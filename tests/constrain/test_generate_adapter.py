"""Batched application of constraints to logits (CPU here; CUDA when present)."""

from __future__ import annotations

import pytest
import torch

from server.chat.tool_choice import plan_tools
from server.constrain.bitmask import MaskApplier
from server.constrain.generate_adapter import ConstraintLogitsProcessor
from server.constrain.vocab import TokenVocab
from tests.constrain.decode import EOS

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def build(compiler, tools, hermes, choice):
    return compiler.build(tools, plan_tools(tools, choice, [], False, None, hermes), EOS)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_masks_only_constrained_rows(compiler, tokenizer, swe_tools, hermes, device):
    v = len(tokenizer)
    constraints = [
        build(compiler, swe_tools, hermes, "required"),
        None,
        build(compiler, swe_tools, hermes, {"type": "function", "function": {"name": "bash"}}),
        build(compiler, swe_tools, hermes, "none"),
    ]
    logits = torch.randn(4, v, device=device)
    before = logits.clone()
    MaskApplier(v).apply(logits, constraints)
    assert torch.equal(logits[1], before[1])
    for row in (0, 2, 3):
        bitmask = torch.zeros(1, (v + 31) // 32, dtype=torch.int32)
        constraints[row].fill_next_token_bitmask(bitmask, 0)
        allowed = sorted(TokenVocab.unpack(bitmask[0].numpy(), v))
        finite = torch.isfinite(logits[row]).nonzero().flatten().tolist()
        assert finite == allowed
        assert torch.equal(logits[row, allowed], before[row, allowed])
    assert torch.isfinite(logits[0]).sum() < 200 and torch.isfinite(logits[3]).sum() > 40000


def test_transformers_style_processor_feeds_back_sampled_tokens(compiler, tokenizer, swe_tools, hermes):
    c = build(compiler, swe_tools, hermes, {"type": "function", "function": {"name": "bash"}})
    proc = ConstraintLogitsProcessor([c], len(tokenizer))
    ids = torch.tensor([[1, 2, 3]])
    for tok in tokenizer.encode('", "arguments": {"command": "ls"}}\n</tool_call>'):
        scores = proc(ids, torch.zeros(1, len(tokenizer)))
        assert torch.isfinite(scores[0, tok])
        ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
    proc(ids, torch.zeros(1, len(tokenizer)))
    assert c.calls == ["bash"] and c.is_terminated() and c.error is None


def test_wrong_batch_size_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="2 rows"):
        MaskApplier(len(tokenizer)).apply(torch.zeros(2, len(tokenizer)), [None])
