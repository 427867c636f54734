"""KV slots: running sequences' caches side by side, one attention call per layer a decode step.

A pooled step must give each row the logits it gets alone (fp32 rounding), whatever the rows'
order, gaps between their slots or the pool's reallocation; slots come back when a cache is
dropped; the budget and the padding bound send sequences to the per-row path instead.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest
import torch

from server.engines.base import GenerationRequest, SamplingParams
from server.engines.hf.kv.blocks import BlockCutter, cached_kv, match_parts
from server.engines.hf.kv.growing import cache_kw, growing_cache, restore
from server.engines.hf.kv.slots import KVSlots, PooledStep
from server.engines.hf.model import rows as model_rows
from server.engines.hf.model.rows import decode_rows
from server.kvcache.prefix_cache import MatchResult
from tests.kvcache.helpers import tiny_model

CPU = torch.device("cpu")
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model():
    return tiny_model(300)


def _prefill(model, kv, n: int, seed: int) -> None:
    ids = torch.randint(0, 300, (1, n), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model(input_ids=ids, **cache_kw(model, kv), use_cache=True)


def _cache(model, n: int, seed: int, pool: KVSlots | None = None, need: int = 256):
    kv = growing_cache(model.config)
    if pool is not None:
        assert pool.admit(kv, need) is not None
    _prefill(model, kv, n, seed)
    return kv


def _alone(model, n: int, seed: int, token: int) -> torch.Tensor:
    kv = _cache(model, n, seed)
    with torch.no_grad():
        return model(input_ids=torch.tensor([[token]]), **cache_kw(model, kv), use_cache=True).logits[0, -1]


@pytest.fixture
def pooled_steps(monkeypatch):
    """How many decode_rows forwards took the pooled path."""
    taken: list[PooledStep] = []
    real = PooledStep.__init__

    def spy(self, *args):
        real(self, *args)
        taken.append(self)

    monkeypatch.setattr(PooledStep, "__init__", spy)
    return taken


def _pool(model, budget: int = 2**26) -> KVSlots:
    return KVSlots(model.config, torch.float32, CPU, budget)


def test_a_pooled_step_equals_each_row_alone_in_any_order_and_with_gaps(model, pooled_steps):
    pool = _pool(model)
    lengths, seeds = [40, 47, 52, 45], [1, 2, 3, 4]
    caches = [_cache(model, n, s, pool) for n, s in zip(lengths, seeds, strict=True)]
    assert [pool.slot_of(c) for c in caches] == [0, 1, 2, 3]
    del caches[1]  # slot 1 freed: rows 0, 2, 3 with a gap
    gc.collect()
    pool.collect()
    assert pool.homes.keys() == {0, 2, 3}
    batch = caches[::-1]  # and not in slot order
    tokens = [7, 8, 9]
    with torch.no_grad():
        rows = decode_rows(model, batch, tokens, CPU, pool)
    assert len(pooled_steps) == 1 and not pooled_steps[0].identity
    for row, (n, s), token in zip(rows, [(45, 4), (52, 3), (40, 1)], tokens, strict=True):
        assert torch.max(torch.abs(row - _alone(model, n, s, token))).item() < TOLERANCE
    assert [c.get_seq_length() for c in batch] == [46, 53, 41]  # each grew by one, in its own slot
    for c in batch:  # the caches' own views read back what the pooled step wrote
        slot = pool.slot_of(c)
        n = c.get_seq_length()
        assert torch.equal(c.layers[0].keys[0], pool.k[0][slot, :, :n])


def test_a_step_without_padding_runs_unmasked_and_one_with_padding_masked(model, pooled_steps):
    pool = _pool(model)
    a, b, c = _cache(model, 30, 1, pool), _cache(model, 30, 2, pool), _cache(model, 29, 3, pool)
    with torch.no_grad():
        pair = decode_rows(model, [a, b], [6, 7], CPU, pool)  # slots 0-1, both 30 tokens
        alone = decode_rows(model, [c], [5], CPU, pool)  # a batch of one
        decode_rows(model, [a, b, c], [8, 9, 10], CPU, pool)  # 31, 31, 30 tokens: padding
    assert [s.mask is None for s in pooled_steps] == [True, True, False]
    mask = pooled_steps[2].mask
    assert mask.shape == (3, 1, 1, 32) and mask[2, 0, 0, 31] == float("-inf") and mask[0, 0, 0, 31] == 0
    for row, (seed, token) in zip(pair, [(1, 6), (2, 7)], strict=True):
        assert torch.max(torch.abs(row - _alone(model, 30, seed, token))).item() < TOLERANCE
    assert torch.max(torch.abs(alone[0] - _alone(model, 29, 3, 5))).item() < TOLERANCE


def test_the_pool_reallocates_under_live_caches_and_they_keep_their_kv(model, pooled_steps):
    pool = _pool(model)
    a = _cache(model, 30, 1, pool, need=40)
    before = a.layers[1].keys.clone()
    b = _cache(model, 35, 2, pool, need=500)  # a larger reservation: every row is reallocated
    assert pool.cap >= 500 and pool.slots == 2
    assert torch.equal(a.layers[1].keys, before)
    with torch.no_grad():
        rows = decode_rows(model, [a, b], [5, 6], CPU, pool)
    assert len(pooled_steps) == 1 and pooled_steps[0].identity
    assert torch.max(torch.abs(rows[0] - _alone(model, 30, 1, 5))).item() < TOLERANCE
    assert torch.max(torch.abs(rows[1] - _alone(model, 35, 2, 6))).item() < TOLERANCE


def test_dropped_caches_give_their_slot_back_and_an_idle_empty_pool_its_memory(model):
    pool = _pool(model)
    a, b = _cache(model, 20, 1, pool), _cache(model, 20, 2, pool)
    assert pool.slot_of(a) == 0 and pool.slot_of(b) == 1
    del a
    gc.collect()
    c = _cache(model, 20, 3, pool)  # admission collects first: the lowest free slot again
    assert pool.slot_of(c) == 0
    del b, c
    gc.collect()
    pool.collect()
    assert not pool.homes and pool.slots == 2  # empty, its memory kept a while for the next burst
    d = _cache(model, 20, 4, pool)
    assert pool.slot_of(d) == 0 and pool.slots == 2  # reused: no regrowth
    pool.release_idle(after_s=60.0)
    assert pool.slots == 2  # not empty: kept
    del d
    gc.collect()
    pool.release_idle(after_s=60.0)
    assert pool.slots == 2  # empty for less than a minute: kept
    pool.release_idle(after_s=0.0)
    assert pool.slots == 0 and pool.k == [] and not pool.homes  # empty long enough: given back


def test_a_release_cannot_slip_between_another_threads_admission_and_its_rows(model):
    """``prefill_logits`` admits from its caller's thread while the engine's idle loop may release
    an empty pool: an admission landing inside a release must not be left homed in 0 rows."""
    pool = _pool(model)
    a = _cache(model, 20, 1, pool)
    del a
    gc.collect()
    pool.collect()
    real, other = pool.collect, {}

    def collect_then_admit_elsewhere():  # the release has looked at the pool: admit from another thread now
        real()
        if not other:
            other["thread"] = threading.Thread(
                target=lambda: other.setdefault("kv", _cache(model, 20, 2, pool))
            )
            other["thread"].start()
            other["thread"].join(timeout=0.5)  # it waits for the lock: the release finishes first

    pool.collect = collect_then_admit_elsewhere
    pool.release_idle(after_s=0.0)  # empty long enough: the release gives the memory back
    other["thread"].join()
    kv = other["kv"]
    slot = pool.slot_of(kv)
    assert slot is not None and pool.slots > slot and pool.cap >= 20  # its row exists in the pool
    k, _ = pool.row(0, slot)
    assert torch.equal(k[0, :, :20], kv.layers[0].keys[0])  # and the cache is that row


def test_past_the_budget_a_sequence_keeps_its_own_buffers_and_decodes_per_row(model, pooled_steps):
    pool = _pool(model, budget=pool_bytes(model, slots=1, tokens=64))
    a = _cache(model, 30, 1, pool, need=64)
    kv = growing_cache(model.config)
    assert pool.admit(kv, 64) is None  # a second row of 64 tokens would pass the budget
    _prefill(model, kv, 33, 2)
    with torch.no_grad():
        rows = decode_rows(model, [a, kv], [5, 6], CPU, pool)
    assert pooled_steps == []
    assert torch.max(torch.abs(rows[1] - _alone(model, 33, 2, 6))).item() < TOLERANCE


def pool_bytes(model, slots: int, tokens: int) -> int:
    return _pool(model).token_bytes * slots * tokens


def test_rows_of_very_different_lengths_run_per_row(model, pooled_steps):
    pool = _pool(model)
    caches = [_cache(model, 10, 1, pool), _cache(model, 12, 2, pool), _cache(model, 200, 3, pool)]
    with torch.no_grad():
        rows = decode_rows(model, caches, [3, 4, 5], CPU, pool)
    assert pooled_steps == []  # padded 3 x 201 > 2 x (11 + 13 + 201) real tokens
    for row, (n, s, t) in zip(rows, [(10, 1, 3), (12, 2, 4), (200, 3, 5)], strict=True):
        assert torch.max(torch.abs(row - _alone(model, n, s, t))).item() < TOLERANCE


def test_a_row_that_runs_out_grows_the_pool_within_the_budget(model, pooled_steps):
    pool = _pool(model)
    a, b = _cache(model, 30, 1, pool, need=32), _cache(model, 31, 2, pool, need=32)
    assert pool.cap == 32
    keys = a.layers[0].keys.clone()
    _prefill(model, a, 10, 3)  # 40 tokens: past the row, the pool reallocates longer rows
    assert pool.cap >= 40 and pool.slot_of(a) == 0 and pool.slot_of(b) == 1
    assert torch.equal(a.layers[0].keys[:, :, :30], keys)
    with torch.no_grad():
        rows = decode_rows(model, [a, b], [5, 6], CPU, pool)
    assert len(pooled_steps) == 1
    assert torch.max(torch.abs(rows[1] - _alone(model, 31, 2, 6))).item() < TOLERANCE


def test_past_the_budget_a_row_that_runs_out_moves_out_with_its_kv(model):
    pool = _pool(model, budget=pool_bytes(model, slots=1, tokens=32))
    kv = _cache(model, 30, 1, pool, need=32)
    keys = kv.layers[0].keys.clone()
    _prefill(model, kv, 10, 2)  # 40 > 32 tokens, and no budget for longer rows
    assert pool.cap == 32
    assert pool.slot_of(kv) is None and kv.layers[0].pool is None
    assert torch.equal(kv.layers[0].keys[:, :, :30], keys)
    assert kv.get_seq_length() == 40


def test_the_engine_decodes_similar_requests_pooled_and_as_alone(hf_engine, tokenizer, monkeypatch):
    taken: list[int] = []
    real = model_rows.PooledStep.__init__

    def spy(self, *args):
        real(self, *args)
        taken.append(self.span)

    monkeypatch.setattr(model_rows.PooledStep, "__init__", spy)

    def request(i: int) -> GenerationRequest:
        question = f"Session {i}: tell me about robot number {i}."
        text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return GenerationRequest(f"pool-{i}", ids, SamplingParams(12 + i, 0.0), None, f"pool-{i}")

    async def tokens(req):
        return [t async for chunk in hf_engine.generate(req) for t in chunk.token_ids]

    async def run():
        alone = [await tokens(request(i)) for i in range(4)]
        together = await asyncio.gather(*(tokens(request(i)) for i in range(4)))
        return alone, together

    alone, together = asyncio.run(run())
    assert together == alone
    assert taken and max(taken) >= 3  # the running requests shared pooled forwards
    # every slot comes back: the last chunk reaches its client before the engine thread caches the
    # request's KV and drops it (steps.finish), so the last slot may come back a moment later
    deadline = time.monotonic() + 30
    while hf_engine.runner.slots.homes and time.monotonic() < deadline:
        time.sleep(0.01)
        hf_engine.runner.slots.collect()
    assert not hf_engine.runner.slots.homes


def _blocks(kv, block_size: int) -> list[torch.Tensor]:
    """``kv``'s tokens as prefix-cache blocks (the last one partial), as a match hands them over."""
    n = kv.get_seq_length()
    cut = BlockCutter(kv, block_size)
    return [cut(i)[0] for i in range(-(-n // block_size))]


def test_a_match_is_restored_straight_into_the_slot_and_decodes_as_the_original(model):
    pool = _pool(model)
    original = _cache(model, 45, 5)  # 45 tokens: blocks of 16, 16 and a 13-token tail
    blocks = _blocks(original, 16)
    match = MatchResult((b"a", b"b", b"c"), tuple(blocks), 16, lengths=(16, 16, 10))
    parts = match_parts(match)  # the tail serves 10 of its 13 tokens
    assert [p.shape[3] for p in parts] == [16, 16, 10]
    other = _cache(model, 20, 6, pool)  # a neighbour in slot 0 keeps its KV
    before = other.layers[-1].keys.clone()
    kv = growing_cache(model.config)
    assert pool.admit(kv, 100) == 1
    assert pool.restore(kv, parts)
    assert kv.get_seq_length() == 42 and pool.slot_of(kv) == 1
    for mine, theirs in zip(kv.layers, original.layers, strict=True):
        assert torch.equal(mine.keys, theirs.keys[:, :, :42]) and torch.equal(
            mine.values, theirs.values[:, :, :42]
        )
    assert torch.equal(other.layers[-1].keys, before)
    with torch.no_grad():  # it goes on like a cache that computed those 42 tokens itself
        rows = decode_rows(model, [kv], [9], CPU, pool)
    ref = growing_cache(model.config)
    restore(ref, cached_kv(parts, CPU))
    with torch.no_grad():
        alone = model(input_ids=torch.tensor([[9]]), **cache_kw(model, ref), use_cache=True).logits[0, -1]
    assert torch.max(torch.abs(rows[0] - alone)).item() < TOLERANCE


def test_restore_leaves_caches_outside_the_pool_or_filled_or_of_another_shape_alone(model):
    pool = _pool(model)
    parts = _blocks(_cache(model, 32, 7), 16)
    private = growing_cache(model.config)  # never admitted
    assert not pool.restore(private, parts) and private.get_seq_length() == 0
    filled = _cache(model, 10, 8, pool)
    assert not pool.restore(filled, parts) and filled.get_seq_length() == 10
    fresh = growing_cache(model.config)
    assert pool.admit(fresh, 64) is not None
    short = [p[:-1] for p in parts]  # one layer too few
    assert not pool.restore(fresh, short) and fresh.get_seq_length() == 0
    assert pool.restore(fresh, parts) and fresh.get_seq_length() == 32


def test_the_engine_restores_a_cached_prefix_into_the_slot(hf_engine, tokenizer, monkeypatch):
    restored: list[bool] = []
    real = KVSlots.restore

    def spy(self, kv, parts):
        restored.append(real(self, kv, parts))
        return restored[-1]

    monkeypatch.setattr(KVSlots, "restore", spy)
    text = "<|im_start|>user\nTell me about the slots of a KV pool.<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]

    async def run(i: int) -> tuple[list[int], int]:
        req = GenerationRequest(f"restore-{i}", ids, SamplingParams(10, 0.0), None, "restore")
        chunks = [chunk async for chunk in hf_engine.generate(req)]
        return [t for c in chunks for t in c.token_ids], chunks[-1].cached_tokens

    (first, cached_first), (second, cached_second) = asyncio.run(run(0)), asyncio.run(run(1))
    assert cached_first == 0 and cached_second > 0  # the second request's prefix came from the cache
    assert restored == [True] and second == first


def test_an_expected_burst_grows_the_pool_once_within_the_budget(model):
    pool = _pool(model)
    resized: list[int] = []
    real = pool.resize
    pool.resize = lambda rows, cap: (resized.append(rows), real(rows, cap))  # type: ignore[method-assign]
    pool.expect(6)
    caches = [_cache(model, 10, i, pool, need=64) for i in range(6)]
    assert resized == [6]  # not 1, 2, 4, 8
    pool.expect(20)
    caches += [_cache(model, 10, i, pool, need=64) for i in range(14)]
    assert resized == [6, 20] and all(pool.slot_of(c) is not None for c in caches)  # not 12, 24
    small = KVSlots(model.config, torch.float32, CPU, 3 * 64 * pool.token_bytes)
    small.expect(50)  # more than the budget holds: each admission still fits exactly
    assert small.admit(growing_cache(model.config), 64) is not None and small.slots == 1
