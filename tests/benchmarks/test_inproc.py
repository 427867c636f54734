"""The in-process harness: a random-weight model inside the hf engine's own prefill + prefix cache."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks.harness.inproc import engine_for, random_model, timed_prefill  # noqa: E402


def test_named_shapes_are_the_real_models_layer_sizes():
    # built on the meta device (no memory) with the real Llama 3 vocabulary: the parameter counts
    # must be the published ones (Llama-3.1-8B 8,030,261,248; Llama-3.2-1B 1,235,814,400)
    for shape, published in (("llama-8b", 8_030_261_248), ("llama-1b", 1_235_814_400)):
        model = random_model(shape, 128_256, device="meta")
        assert sum(p.numel() for p in model.parameters()) == published, shape
    with pytest.raises(ValueError, match="unknown shape"):
        random_model("llama-70b", 100, device="cpu")


def test_engine_prefill_reuses_the_cache_and_matches_uncached_logits():
    model = random_model("tiny", 512, device="cpu", dtype=torch.float32, max_positions=4096)
    on = engine_for(model, tokenizer=None, cache=True, memory_mb=64)
    off = engine_for(model, tokenizer=None, cache=False)
    ids = [(i * 7919) % 512 for i in range(300)]
    _, cached = timed_prefill(on, ids[:200])
    assert cached == 0
    t0 = time.perf_counter()
    t, cached = timed_prefill(on, ids)
    wall = time.perf_counter() - t0
    assert cached == 192  # 6 full blocks of 32 from the first prompt
    assert 0 < t <= wall  # seconds of this very call (not ms, not a constant, not a total)
    warm, _ = on.prefill_logits(ids)
    cold, c0 = off.prefill_logits(ids)
    assert c0 == 0
    assert torch.allclose(warm, cold, atol=1e-4)


def test_paired_measurement_restores_the_cache_between_runs():
    from benchmarks.harness.inproc import paired_at_turn

    model = random_model("tiny", 512, device="cpu", dtype=torch.float32, max_positions=4096)
    eng = engine_for(model, tokenizer=None, cache=True, memory_mb=64)
    ids = [(i * 31) % 512 for i in range(260)]
    timed_prefill(eng, ids[:200])
    before = len(eng.cache)
    res = paired_at_turn(eng, ids, repeats=2)
    assert len(eng.cache) == before and eng.cache.enabled
    assert res["cached_tokens"] == 192 and len(res["cached_s"]) == len(res["uncached_s"]) == 2
    assert res["ratio"] > 0
