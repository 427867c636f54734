"""The prefix cache's tiers: which blocks stay in tier 1 under the byte budget, and moving them.

``Tiers`` keeps a ``BlockIndex`` (the cache's, shared) within a tier-1 byte budget, with
an optional second tier (``tier2``). Over budget, blocks are evicted in the policy's order
(``lru``: least recently used first, and a hit touches its chain tail first, so chains
are trimmed from the end; ``session``: ``retention.session_eviction_order``). An evicted
block moves to tier 2 when there is one and its payload is a tensor, else it is dropped.
``take`` brings a block back from tier 2 on a hit when the ``CostModel`` predicts
restoring costs less than recomputing. A tier-2 store that degrades (unwritable) turns
tier 2 off. ``PrefixCache`` (prefix_cache.py) owns one (``cache.tiers``) and builds lookup
and insert on it; callers hold its lock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from server.kvcache.cost_model import CostModel
from server.kvcache.index import BlockIndex
from server.kvcache.retention import SessionRecords, session_eviction_order
from server.kvcache.sessions import CacheCounters
from server.kvcache.tier2 import Tier2Store

POLICIES = ("lru", "session")


class Tiers:
    """Tier-1 budget, eviction and tier 2 over a ``BlockIndex`` (a part of ``PrefixCache``)."""

    def __init__(
        self,
        index: BlockIndex,
        capacity_bytes: int,
        policy: str,
        tier2: Tier2Store | None,
        cost: CostModel | None,
        clock: Callable[[], float],
        counters: CacheCounters,
        sessions: SessionRecords,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"prefix cache policy must be one of {POLICIES}, got {policy!r}")
        self.index = index
        self.capacity_bytes = capacity_bytes
        self.policy = policy
        self.tier2 = tier2 if tier2 is not None and tier2.enabled else None
        self.cost = cost or CostModel()
        self.clock = clock
        self.counters = counters
        self.sessions = sessions
        self.evictions = 0
        self._plan: deque[bytes] | None = None  # the eviction order, kept across one lookup's restores

    def take(self, h: bytes, protect: list[bytes]) -> tuple[Any, bool]:
        """The payload of block ``h`` (restored from tier 2 if worth it), and whether it was restored."""
        index = self.index
        blk = index.blocks.get(h)
        if blk is None:
            return None, False
        if blk.tier == 1:
            return blk.payload, False
        if self.tier2 is None:
            return None, False
        protected = sum(index.blocks[k].nbytes for k in protect if k in index)
        if protected + blk.nbytes > self.capacity_bytes:
            return None, False
        if not self.cost.worth_restoring(blk.nbytes, len(blk.tokens)):
            self.counters.restores_skipped += 1
            return None, False
        t0 = time.perf_counter()
        payload = self.tier2.get(h, blk.parent, blk.tokens)
        if payload is None:
            self.counters.tier2_faults += 1
            self.forget(h)
            return None, False
        self.cost.observe_restore(blk.nbytes, time.perf_counter() - t0)
        self.counters.blocks_restored += 1
        self.counters.bytes_from_tier2 += blk.nbytes
        index.to_tier1(h, payload, self.clock())
        self.evict(protect=frozenset([*protect, h]), keep_plan=True)
        return payload, True

    def forget(self, h: bytes) -> None:
        """Drop block ``h`` from the index, and from tier 2 when it lives there."""
        blk = self.index.unlink(h)
        if blk is not None and blk.tier == 2 and self.tier2 is not None:
            self.tier2.discard(h)

    # -- eviction ---------------------------------------------------------------
    def evict(self, protect: frozenset[bytes] = frozenset(), *, keep_plan: bool = False) -> None:
        """Demote blocks in the policy's order until tier 1 is within its budget.

        ``keep_plan``: reuse the order computed by the previous such call (``take`` during one
        lookup: each restore evicts, and nothing else changes meanwhile but the restored blocks,
        which ``protect`` holds; ``drop_plan`` ends it). Computing the order anew per restored
        block made a lookup quadratic in its chain (the tier-2 replays of issue 38)."""
        index = self.index
        if not keep_plan:
            self._plan = None
        if index.used_bytes <= self.capacity_bytes:
            return
        if self._plan is None:
            self._plan = deque(self._order())
        plan = self._plan
        while plan and index.used_bytes > self.capacity_bytes:
            h = plan.popleft()  # protected ones stay protected for the rest of the lookup
            if h not in protect and h in index:
                self._demote(h)
        if not keep_plan:
            self._plan = None

    def drop_plan(self) -> None:
        self._plan = None

    def _order(self) -> list[bytes]:
        index = self.index
        if self.policy == "session":
            now = self.clock()
            return session_eviction_order(index.lru, list(index.lru), self.sessions, now, index.lru_age(now))
        return list(index.lru)

    def _demote(self, h: bytes) -> None:
        """Move a tier-1 block to tier 2, or drop it when there is no tier 2."""
        blk = self.index.blocks[h]
        self.evictions += 1
        store = self.tier2
        if store is None or not hasattr(blk.payload, "element_size"):
            self.forget(h)
            return
        payload = self.index.to_tier2(h)
        dropped = store.put(h, blk.parent, blk.tokens, payload)
        if h not in dropped:
            self.counters.bytes_to_tier2 += blk.nbytes
        if not store.enabled:  # degraded (unwritable): forget every tier-2 block, go on with one tier
            self.tier2 = None
            for k in [k for k, b in self.index.blocks.items() if b.tier == 2]:
                self.forget(k)
            return
        for k in dropped:
            self.forget(k)

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
