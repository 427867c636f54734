"""The lean decode forward: the family's own layers without transformers' model wrapper.

Each row's logits must equal transformers' forward of that sequence alone (fp32 rounding),
step after step (the lean forward writes the KV the next step reads), for every family it
covers, fused or not, pooled or not; any other model runs transformers' forward.
"""

from __future__ import annotations

import pytest
import torch

from server.engines.hf.kv.growing import cache_kw, growing_cache
from server.engines.hf.kv.slots import KVSlots
from server.engines.hf.linears.fused import fuse_projections
from server.engines.hf.linears.install import install_linears
from server.engines.hf.model import rows as model_rows
from server.engines.hf.model.lean import lean_decode_supported
from server.engines.hf.model.rows import decode_rows
from tests.engines.hf.tiny_models import FAMILIES, tiny

CPU = torch.device("cpu")
TOLERANCE = 1e-4
PROMPTS = [list(range(5, 17)), list(range(40, 71)), list(range(100, 105))]  # three lengths


def _prefilled(model, ids, pool=None):
    kv = growing_cache(model.config)
    if pool is not None:
        pool.admit(kv, len(ids) + 8)
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), **cache_kw(model, kv), use_cache=True, logits_to_keep=1)
    return kv


def _alone(model, ids, steps):
    """transformers' forward, one sequence: the logits of each of ``steps`` decode tokens."""
    kv = _prefilled(model, ids)
    out = []
    with torch.no_grad():
        for token in steps:
            logits = model(input_ids=torch.tensor([[token]]), **cache_kw(model, kv), use_cache=True).logits
            out.append(logits[0, -1])
    return out


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_covered_family_is_lean(model_type):
    assert lean_decode_supported(tiny(model_type))


def test_a_sliding_window_or_another_layout_runs_transformers_forward(monkeypatch):
    assert not lean_decode_supported(tiny("mistral", sliding_window=16))
    assert not lean_decode_supported(tiny("gpt2"))
    calls = []
    monkeypatch.setattr(model_rows, "decode_forward", lambda *a, **k: calls.append(a))
    model = tiny("mistral", sliding_window=16)
    caches = [_prefilled(model, ids) for ids in PROMPTS]
    logits = decode_rows(model, caches, [3, 4, 5], CPU)
    assert not calls and logits.shape == (3, model.config.vocab_size)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@pytest.mark.parametrize("variant", ["plain", "fused+onednn", "fused+onednn+pooled"])
def test_lean_rows_equal_transformers_forward_alone(model_type, variant, monkeypatch):
    steps = [[3, 4, 5], [9, 8, 7], [11, 12, 13]]  # three decode steps of three rows
    reference = tiny(model_type)
    want = [_alone(reference, ids, [s[i] for s in steps]) for i, ids in enumerate(PROMPTS)]

    model = tiny(model_type)
    if variant != "plain":
        fuse_projections(model)
        install_linears(model, CPU, torch.float32)
    pool = KVSlots(model.config, torch.float32, CPU, 2**24) if variant.endswith("pooled") else None
    lean_calls = []
    real = model_rows.decode_forward
    spy = lambda *a, **k: lean_calls.append(1) or real(*a, **k)  # noqa: E731
    monkeypatch.setattr(model_rows, "decode_forward", spy)
    caches = [_prefilled(model, ids, pool) for ids in PROMPTS]
    for n, tokens in enumerate(steps):
        with torch.no_grad():  # as on the engine thread
            rows = decode_rows(model, caches, tokens, CPU, pool)
        for i in range(len(PROMPTS)):
            assert torch.max(torch.abs(rows[i] - want[i][n])).item() < TOLERANCE, (model_type, variant, n, i)
        with torch.no_grad():
            one = [_prefilled(model, PROMPTS[0] + [s[0] for s in steps[:n]])]
            alone = decode_rows(model, one, [tokens[0]], CPU)
        assert torch.max(torch.abs(alone[0] - want[0][n])).item() < TOLERANCE  # a batch of one
    assert [c.get_seq_length() for c in caches] == [len(ids) + len(steps) for ids in PROMPTS]
    if pool is not None:
        assert all(pool.slot_of(c) is not None for c in caches)  # the steps ran pooled
    assert len(lean_calls) == 2 * len(steps)
