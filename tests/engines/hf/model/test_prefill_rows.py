"""Prefill chunks of several sequences in one forward: each row as if prefilled alone.

Rows of different cached lengths and chunk lengths (one token up), KV in slots or not:
each row's last logits, its KV (the next decode step reads it) and nothing of the padding
must equal transformers' prefill of that sequence alone, within fp32 rounding.
"""

from __future__ import annotations

import pytest
import torch

from server.engines.hf.kv.growing import cache_kw, growing_cache
from server.engines.hf.kv.slots import KVSlots
from server.engines.hf.linears.fused import fuse_projections
from server.engines.hf.linears.install import install_linears
from server.engines.hf.model.rows import prefill_rows
from server.families.model_facts import facts_of_model
from tests.conftest import worker_settings
from tests.engines.hf.tiny_models import FAMILIES, tiny

CPU = torch.device("cpu")
TOLERANCE = 1e-4
# (cached prefix, new chunk): a fresh prompt, a long chunk on a short prefix, one token, a mid one
ROWS = [
    (list(range(3, 3)), list(range(3, 40))),
    (list(range(5, 15)), list(range(50, 90))),
    (list(range(7, 60)), [99]),
    (list(range(8, 30)), list(range(120, 137))),
]


def _forward(model, kv, ids):
    out = model(input_ids=torch.tensor([ids]), **cache_kw(model, kv), use_cache=True, logits_to_keep=1)
    return out.logits[0, -1]


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@pytest.mark.parametrize("variant", ["plain", "fused+onednn+pooled"])
def test_prefill_rows_equal_each_sequence_prefilled_alone(model_type, variant):
    reference = tiny(model_type)
    model = tiny(model_type)
    if variant != "plain":
        fuse_projections(model)
        install_linears(model, CPU, torch.float32)
    pool = KVSlots(model.config, torch.float32, CPU, 2**24) if variant.endswith("pooled") else None
    with torch.no_grad():
        want, want_next = [], []
        for prefix, chunk in ROWS:
            kv = growing_cache(reference.config)
            if prefix:
                _forward(reference, kv, prefix)
            want.append(_forward(reference, kv, chunk))
            want_next.append(_forward(reference, kv, [11]))  # reads the chunk's KV
        caches = []
        for prefix, chunk in ROWS:
            kv = growing_cache(model.config)
            if pool is not None:
                pool.admit(kv, len(prefix) + len(chunk) + 8)
            if prefix:
                _forward(model, kv, prefix)
            caches.append(kv)
        got = prefill_rows(model, caches, [c for _, c in ROWS], [len(p) for p, _ in ROWS], CPU)
        assert [c.get_seq_length() for c in caches] == [len(p) + len(c) for p, c in ROWS]  # no padding kept
        for i, kv in enumerate(caches):
            assert torch.max(torch.abs(got[i] - want[i])).item() < TOLERANCE, (model_type, variant, i)
            assert torch.max(torch.abs(_forward(model, kv, [11]) - want_next[i])).item() < TOLERANCE


def test_a_family_the_lean_forward_does_not_cover_prefills_through_transformers(
    hf_engine, tokenizer, monkeypatch
):
    """The engine's prefill turn with a model outside ``LEAN_MODEL_TYPES`` (a sliding window): one
    transformers forward per sequence, the same logits as prefilling each alone."""
    from server.engines.base import GenerationRequest, SamplingParams
    from server.engines.hf import runner
    from server.engines.hf.engine import HFEngine
    from server.engines.hf.sequence import SequenceState
    from tests.engines.hf.model.test_rows import _Sink

    model, reference = tiny("mistral", sliding_window=16), tiny("mistral", sliding_window=16)
    facts = facts_of_model(worker_settings(), tokenizer, model)
    engine = HFEngine(hf_engine.settings, facts, model=model)  # no thread: turns by hand
    prompts = [list(range(3, 40)), list(range(50, 61))]
    seqs = [
        SequenceState(
            GenerationRequest(f"w{i}", ids, SamplingParams(2, 0.0), None, f"w{i}"), _Sink(), _Sink()
        )
        for i, ids in enumerate(prompts)
    ]
    calls = []
    monkeypatch.setattr(runner, "prefill_rows", lambda *a: calls.append(a))
    with torch.no_grad():
        chunks = [engine.runner.prefill_take(s) for s in seqs]
        got = engine.runner.prefill_forward(seqs, chunks)
        want = [_forward(reference, growing_cache(reference.config), ids) for ids in prompts]
    assert not calls  # not the lean rows
    assert chunks == prompts
    for i in range(len(prompts)):
        assert torch.max(torch.abs(got[i] - want[i])).item() < TOLERANCE


def test_grouped_heads_go_to_sdpa_only_where_its_fast_kernels_take_them():
    from server.engines.hf.model.rows import gqa_in_sdpa

    mask = torch.ones((2, 5), dtype=torch.bool)
    assert gqa_in_sdpa(mask, torch.device("cpu")) and gqa_in_sdpa(None, torch.device("cuda"))
    assert not gqa_in_sdpa(mask, torch.device("cuda"))  # masked: the K/V are repeated per query head


def test_prefill_rows_with_the_kv_repeated_per_head_equal_grouped_heads(monkeypatch):
    from server.engines.hf.model import rows as model_rows

    model = tiny("llama")  # 4 query heads over 2 KV heads
    chunks, starts = [c for _, c in ROWS], [len(p) for p, _ in ROWS]

    def run():
        caches = []
        for prefix, _ in ROWS:
            kv = growing_cache(model.config)
            if prefix:
                _forward(model, kv, prefix)
            caches.append(kv)
        return prefill_rows(model, caches, chunks, starts, CPU)

    with torch.no_grad():
        grouped = run()
        monkeypatch.setattr(model_rows, "gqa_in_sdpa", lambda mask, device: mask is None)  # CUDA's rule
        repeated = run()
    assert torch.max(torch.abs(grouped - repeated)).item() < TOLERANCE
