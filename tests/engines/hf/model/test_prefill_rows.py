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


def _rows_on_cached_prefixes(model):
    """``ROWS``' chunks prefilled as rows over their prefixes (each prefilled alone first)."""
    caches = []
    for prefix, _ in ROWS:
        kv = growing_cache(model.config)
        if prefix:
            _forward(model, kv, prefix)
        caches.append(kv)
    logits = prefill_rows(model, caches, [c for _, c in ROWS], [len(p) for p, _ in ROWS], CPU)
    return logits, caches


def test_prefill_rows_with_the_kv_repeated_per_head_equal_grouped_heads(monkeypatch):
    from server.engines.hf.model import rows as model_rows

    model = tiny("llama")  # 4 query heads over 2 KV heads
    monkeypatch.setattr(model_rows, "shared_prefix_available", lambda device: False)  # masked rows
    with torch.no_grad():
        grouped, _ = _rows_on_cached_prefixes(model)
        monkeypatch.setattr(model_rows, "gqa_in_sdpa", lambda mask, device: mask is None)  # CUDA's rule
        repeated, _ = _rows_on_cached_prefixes(model)
    assert torch.max(torch.abs(grouped - repeated)).item() < TOLERANCE


def test_a_chunk_over_cached_keys_in_two_calls_equals_one_masked_call(monkeypatch):
    """CPU: a row with cached keys attends in two flash calls merged by log-sum-exp (cached keys
    unmasked, its own causal); the same logits and KV as one SDPA under the offset-causal mask."""
    from server.engines.hf.model import rows as model_rows
    from server.engines.hf.model import shared_prefix

    model = tiny("llama")
    starts = [len(p) for p, _ in ROWS]
    split_calls = []
    merged = shared_prefix.prefix_then_causal

    def counted(*args, **kwargs):
        split_calls.append(args[3])
        return merged(*args, **kwargs)

    def run():
        logits, caches = _rows_on_cached_prefixes(model)
        return logits, [_forward(model, kv, [11]) for kv in caches]

    monkeypatch.setattr(model_rows, "prefix_then_causal", counted)
    with torch.no_grad():
        split, split_next = run()
        assert split_calls == [s for s in starts if s] * model.config.num_hidden_layers
        monkeypatch.setattr(model_rows, "shared_prefix_available", lambda device: False)  # CUDA's path
        masked, masked_next = run()
    assert len(split_calls) == 3 * model.config.num_hidden_layers  # the masked run made none
    assert torch.max(torch.abs(split - masked)).item() < TOLERANCE
    for a, b in zip(split_next, masked_next, strict=True):
        assert torch.max(torch.abs(a - b)).item() < TOLERANCE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("start", "n"), [(1, 1), (300, 200), (64, 513)])
def test_prefix_then_causal_equals_sdpa_under_the_offset_causal_mask(dtype, start, n):
    from server.engines.hf.model.shared_prefix import prefix_then_causal

    gen = torch.Generator().manual_seed(start + n)
    q = torch.randn(1, 6, n, 32, generator=gen).to(dtype)  # 6 query heads over 2 KV heads
    k, v = (torch.randn(1, 2, start + n, 32, generator=gen).to(dtype) for _ in range(2))
    allowed = torch.ones((n, start + n), dtype=torch.bool).tril(start)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=allowed, scale=0.2, enable_gqa=True
    )
    got = prefix_then_causal(q, k, v, start, 0.2)
    assert got.dtype == dtype and got.shape == want.shape
    assert torch.max(torch.abs(got.float() - want)).item() < (TOLERANCE if dtype == torch.float32 else 0.03)
