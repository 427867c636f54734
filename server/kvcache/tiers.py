"""The prefix cache's tiers: which blocks stay in tier 1 under the byte budget, and moving them.

``TieredIndex`` is a ``BlockIndex`` with a tier-1 byte budget and, optionally, a second
tier (``kv_tier2``). Over budget, blocks are evicted in the policy's order (``lru``: least
recently used first, and a hit touches its chain tail first, so chains are trimmed from
the end; ``session``: ``kv_retention.session_eviction_order``). An evicted block moves to
tier 2 when there is one and its payload is a tensor, else it is dropped. ``_take``
brings a block back from tier 2 on a hit when the ``CostModel`` predicts restoring costs
less than recomputing. A tier-2 store that degrades (unwritable) turns tier 2 off.
``PrefixCache`` (prefix_cache.py) builds lookup and insert on this; callers hold its lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from server.kvcache.index import BlockIndex
from server.kvcache.retention import Sessions, session_eviction_order
from server.kvcache.sessions import CacheCounters
from server.kvcache.tier2 import CostModel, Tier2Store

POLICIES = ("lru", "session")


class TieredIndex(BlockIndex):
    def __init__(
        self,
        capacity_bytes: int,
        policy: str,
        tier2: Tier2Store | None,
        cost: CostModel | None,
        clock: Callable[[], float],
        counters: CacheCounters,
        sessions: Sessions,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"prefix cache policy must be one of {POLICIES}, got {policy!r}")
        super().__init__()
        self.capacity_bytes = capacity_bytes
        self.policy = policy
        self.tier2 = tier2 if tier2 is not None and tier2.enabled else None
        self.cost = cost or CostModel()
        self.clock = clock
        self.counters = counters
        self.sessions = sessions
        self.evictions = 0

    def _take(self, h: bytes, protect: list[bytes]) -> tuple[Any, bool]:
        """The payload of block ``h`` (restored from tier 2 if worth it), and whether it was restored."""
        blk = self._blocks.get(h)
        if blk is None:
            return None, False
        if blk.tier == 1:
            return blk.payload, False
        if self.tier2 is None:
            return None, False
        protected = sum(self._blocks[k].nbytes for k in protect if k in self._lru)
        if protected + blk.nbytes > self.capacity_bytes:
            return None, False
        if not self.cost.worth_restoring(blk.nbytes, len(blk.tokens)):
            self.counters.restores_skipped += 1
            return None, False
        t0 = time.perf_counter()
        payload = self.tier2.get(h, blk.parent, blk.tokens)
        if payload is None:
            self.counters.tier2_faults += 1
            self._forget(h)
            return None, False
        self.cost.observe_restore(blk.nbytes, time.perf_counter() - t0)
        self.counters.blocks_restored += 1
        self.counters.bytes_from_tier2 += blk.nbytes
        blk.payload, blk.tier = payload, 1
        self._lru[h] = None
        self._bytes += blk.nbytes
        self._evict_locked(protect=frozenset([*protect, h]))
        return payload, True

    def _forget(self, h: bytes) -> None:
        blk = self._unlink(h)
        if blk is not None and blk.tier == 2 and self.tier2 is not None:
            self.tier2.discard(h)

    # -- eviction ---------------------------------------------------------------
    def _evict_locked(self, protect: frozenset[bytes] = frozenset()) -> None:
        if self._bytes <= self.capacity_bytes:
            return
        if self.policy == "session":
            order = session_eviction_order(self._lru, list(self._lru), self.sessions, self.clock())
        else:
            order = list(self._lru)
        for h in order:
            if self._bytes <= self.capacity_bytes:
                break
            if h not in protect and h in self._lru:
                self._demote(h)

    def _demote(self, h: bytes) -> None:
        """Move a tier-1 block to tier 2, or drop it when there is no tier 2."""
        blk = self._blocks[h]
        self.evictions += 1
        store = self.tier2
        if store is None or not hasattr(blk.payload, "element_size"):
            self._forget(h)
            return
        self._lru.pop(h)
        self._bytes -= blk.nbytes
        payload, blk.payload, blk.tier = blk.payload, None, 2
        dropped = store.put(h, blk.parent, blk.tokens, payload)
        if h not in dropped:
            self.counters.bytes_to_tier2 += blk.nbytes
        if not store.enabled:  # degraded (unwritable): forget every tier-2 block, go on with one tier
            self.tier2 = None
            for k in [k for k, b in self._blocks.items() if b.tier == 2]:
                self._forget(k)
            return
        for k in dropped:
            self._forget(k)

    # -- introspection ----------------------------------------------------------
    @property
    def tier2_bytes(self) -> int:
        return self.tier2.used_bytes if self.tier2 is not None else 0

    def tier_names(self, device_type: str) -> tuple[str, ...]:
        """Where blocks live, tier 1 first (cache-miss reasons name the last as where blocks were lost)."""
        names = [f"tier 1 ({device_type} memory)"]
        if self.tier2 is not None:
            where = getattr(self.tier2, "path", None)
            names.append(f"tier 2 (disk folder {where})" if where else "tier 2 (host RAM)")
        return tuple(names)
