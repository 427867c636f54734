"""A lookup that restores many blocks from tier 2 computes the eviction order once, not per block
(it made the tier-2 trace replays of issue 38 spend half their time ordering), with the same result."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from server.kvcache import tiers  # noqa: E402
from server.kvcache.cost_model import CostModel  # noqa: E402
from server.kvcache.prefix_cache import PrefixCache  # noqa: E402
from server.kvcache.tier2 import HostStore  # noqa: E402

BLOCK_BYTES = 16  # 4 float32 per block


def payload(i: int) -> tuple[torch.Tensor, int]:
    return torch.full((4,), float(i)), BLOCK_BYTES


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_lookup_restoring_four_blocks_orders_eviction_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = tiers.session_eviction_order
    monkeypatch.setattr(tiers, "session_eviction_order", lambda *a: calls.append(1) or real(*a))
    clock = Clock()
    c = PrefixCache(
        2,
        4 * BLOCK_BYTES,
        policy="session",
        tier2=HostStore(100 * BLOCK_BYTES),
        cost=CostModel("always"),
        clock=clock,
    )
    a, b = [1] * 8, [2] * 8  # 4 blocks each; tier 1 holds 4
    for key, ids in (("a", a), ("b", b)):
        c.match(ids, session=key)
        c.insert(ids, "", payload, session=key)
        c.reply_finished(key, ("shell",))
        clock.t += 1
    assert [c.tier_of(h) for h in c.block_hashes(a)] == [2, 2, 2, 2]
    calls.clear()
    m = c.match(a, session="a")  # a is back: its 4 blocks come back, each evicting one of b's
    assert m.cached_tokens == 8 and m.tier2_tokens == 8
    assert [c.tier_of(h) for h in c.block_hashes(a)] == [1, 1, 1, 1]
    assert [c.tier_of(h) for h in c.block_hashes(b)] == [2, 2, 2, 2]
    assert len(calls) == 1  # before: 4, one per restored block
    m = c.match(b, session="b")  # the next lookup orders anew (the clock and sessions moved on)
    assert m.tier2_tokens == 8 and len(calls) == 2
    assert c.used_bytes <= c.capacity_bytes
