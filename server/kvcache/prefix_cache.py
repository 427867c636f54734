"""Block-hash prefix cache (hf engine): reuse the KV of the longest cached prefix, to the token.

A sequence is cut into blocks of ``block_size`` tokens, each keyed by a chained hash that
names the whole prefix (``block_keys.py``); the last block may be partial (a *tail*). Every
block also records its parent key and its tokens, and the cache indexes children by parent.

Lookup walks the chain of full blocks from the first and stops at the first miss; then,
among the cached children of the last hit (full blocks and tails), it takes the one
sharing the longest run of tokens with the rest of the prompt, and reuses that many of
its tokens (a block's KV at position p depends only on tokens <= p, so any prefix of a
block is valid). This is what makes the whole previous prompt and the generated reply
reusable: the engine inserts, when a request ends, the KV of prompt + generated tokens
including the partial last block (``insert(..., tail=True)``). A tail that a later full
block covers is a duplicate and is dropped.

The cache is made of parts, not base classes: ``index`` (``index.BlockIndex``: blocks,
children, LRU order, bytes), ``tiers`` (``tiers.Tiers``: eviction under the byte budget
and the second tier) and ``book`` (``sessions.SessionBook``). ``policy="lru"`` evicts
least recently used first; ``policy="session"`` asks ``retention`` (blocks no waiting
session needs first, then sessions by expected time to return). With a second tier
(``tier2``), evicted blocks move there and come back on a hit when restoring is
measured to cost less than recomputing.

The cache stores opaque payloads with a byte size; the engine decides what a block's KV
is (for transformers: one tensor [layers, 2, kv_heads, tokens, head_dim]). Tier 2 needs
tensor payloads.

For diagnostics (cache-miss reasons) each lookup with a session key yields a
``LookupReport``: what the session was waiting on and for how long, how many tokens of
its previous prompt + reply were still a prefix, how many came from tier 2 and how many
had been evicted from both tiers. ``stats()`` gives the counters /metrics shows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from server.kvcache.block_keys import block_keys, chain_key, root_key
from server.kvcache.cost_model import CostModel
from server.kvcache.index import Block, BlockIndex
from server.kvcache.retention import SessionRecords
from server.kvcache.sessions import CacheCounters, LookupReport, SessionBook, cache_metrics
from server.kvcache.tier2 import Tier2Store
from server.kvcache.tiers import Tiers


@dataclass(frozen=True)
class MatchResult:
    """The cached prefix of a prompt: block ``i`` serves its first ``lengths[i]`` tokens."""

    hashes: tuple[bytes, ...]
    blocks: tuple[Any, ...]
    block_size: int
    lengths: tuple[int, ...] = ()
    tier2_tokens: int = 0
    report: LookupReport | None = None

    @property
    def cached_tokens(self) -> int:
        return sum(self.lengths) if self.lengths else len(self.blocks) * self.block_size


class PrefixCache:
    def __init__(
        self,
        block_size: int,
        capacity_bytes: int,
        enabled: bool = True,
        *,
        policy: str = "lru",
        tier2: Tier2Store | None = None,
        cost: CostModel | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_sessions: int = 4096,
        session_cap_s: float = 600.0,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enabled = enabled and capacity_bytes > 0
        self.counters = CacheCounters()
        self.book = SessionBook(max_sessions, session_cap_s, block_size, self.counters)
        self.index = BlockIndex()  # the blocks of both tiers (parts, not bases: each file one job)
        self.tiers = Tiers(
            self.index, capacity_bytes, policy, tier2, cost, clock, self.counters, self.book.sessions
        )
        self._lock = threading.RLock()

    # -- the parts' settings and state, as one cache shows them ---------------
    @property
    def capacity_bytes(self) -> int:
        return self.tiers.capacity_bytes

    @capacity_bytes.setter
    def capacity_bytes(self, value: int) -> None:
        self.tiers.capacity_bytes = value

    @property
    def clock(self) -> Callable[[], float]:
        return self.tiers.clock

    @clock.setter
    def clock(self, value: Callable[[], float]) -> None:
        self.tiers.clock = value

    @property
    def tier2(self) -> Tier2Store | None:
        """The second tier (None: none, or turned off after it degraded)."""
        return self.tiers.tier2

    @property
    def cost(self) -> CostModel:
        return self.tiers.cost

    @property
    def sessions(self) -> SessionRecords:
        return self.book.sessions

    @property
    def evictions(self) -> int:
        return self.tiers.evictions

    @property
    def used_bytes(self) -> int:
        """Tier-1 bytes."""
        return self.index.used_bytes

    def tier_of(self, block_hash: bytes) -> int | None:
        return self.index.tier_of(block_hash)

    def tier_names(self, device_type: str) -> tuple[str, ...]:
        return self.tiers.tier_names(device_type)

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.index

    def snapshot(self) -> Any:
        """The tier-1 contents, for ``restore`` (paired benchmark runs; tier 2 is not included)."""
        with self._lock:
            return self.index.snapshot()

    def restore(self, snap: Any) -> None:
        with self._lock:
            self.index.restore(snap)

    # -- keys -----------------------------------------------------------------
    def root(self, salt: str = "") -> bytes:
        return root_key(salt)

    def block_hashes(self, token_ids: Sequence[int], salt: str = "") -> list[bytes]:
        """Chained keys of every full block of ``token_ids``."""
        return block_keys(token_ids, self.block_size, salt)

    # -- lookup ---------------------------------------------------------------
    def match(
        self,
        token_ids: Sequence[int],
        salt: str = "",
        max_blocks: int | None = None,
        *,
        max_tokens: int | None = None,
        session: str = "",
        retain_s: float = 0.0,
    ) -> MatchResult:
        """The longest cached prefix of ``token_ids`` (at most ``max_tokens`` / ``max_blocks`` blocks).
        ``retain_s``: the client's retention hint for ``session`` (``SessionRecord.keep_s``)."""
        if not self.enabled:
            return MatchResult((), (), self.block_size)
        limit = len(token_ids) if max_tokens is None else min(max_tokens, len(token_ids))
        if max_blocks is not None:
            limit = min(limit, max_blocks * self.block_size)
        bs = self.block_size
        with self._lock:
            hashes = partial(self.block_hashes, salt=salt)
            pre = self.book.begin(session, token_ids, hashes, self.clock(), retain_s) if session else None
            keys: list[bytes] = []
            lengths: list[int] = []
            payloads: list[Any] = []
            tier2_tokens = 0
            parent = self.root(salt)
            pos = 0
            missed = b""
            self.tiers.drop_plan()  # this lookup's restores share one eviction order (tiers.evict)
            while pos + bs <= limit:
                h = chain_key(parent, token_ids[pos : pos + bs])
                payload, restored = self.tiers.take(h, keys)
                if payload is None:
                    missed = h
                    break
                keys.append(h)
                lengths.append(bs)
                payloads.append(payload)
                tier2_tokens += bs if restored else 0
                parent = h
                pos += bs
            # token-granular: the cached child of the last hit that shares the most tokens
            best, best_n = self.index.best_child(parent, token_ids[pos:limit], skip=missed)
            if best is not None:
                payload, restored = self.tiers.take(best, keys)
                if payload is not None:
                    keys.append(best)
                    lengths.append(best_n)
                    payloads.append(payload)
                    tier2_tokens += best_n if restored else 0
                    self.counters.tail_hit_tokens += best_n
            self.tiers.drop_plan()
            self.index.touch(keys, self.clock())
            cached = sum(lengths)
            self.counters.hit_tokens_tier1 += cached - tier2_tokens
            self.counters.hit_tokens_tier2 += tier2_tokens
            report = (
                self.book.report(session, pre, len(token_ids), cached, tier2_tokens)
                if pre is not None
                else None
            )
        return MatchResult(tuple(keys), tuple(payloads), bs, tuple(lengths), tier2_tokens, report)

    # -- insert ---------------------------------------------------------------
    def insert(
        self,
        token_ids: Sequence[int],
        salt: str,
        payload_for_block: Callable[[int], tuple[Any, int]],
        *,
        tail: bool = False,
        session: str = "",
    ) -> int:
        """Cache every block of ``token_ids`` not cached yet; returns how many were added.

        Full blocks always; with ``tail`` also the partial last block. ``payload_for_block(i)``
        returns (payload, nbytes) of block i (tokens ``[i*bs, min((i+1)*bs, len))``); it is only
        called for blocks not already in tier 1, and not past the point where this chain alone
        would exceed the budget. ``session`` makes this chain the session's latest.
        """
        if not self.enabled:
            return 0
        bs = self.block_size
        n_blocks = (len(token_ids) + (bs - 1 if tail else 0)) // bs
        added = 0
        chain_bytes = last_nbytes = covered = 0
        kept: list[bytes] = []
        tokens: tuple[int, ...] = ()
        parent = self.root(salt)
        with self._lock:
            for i in range(n_blocks):
                tokens = tuple(token_ids[i * bs : (i + 1) * bs])
                h = chain_key(parent, tokens)
                blk = self.index.blocks.get(h)
                if blk is None and len(tokens) < bs:
                    cover = self.index.covering_sibling(parent, tokens)
                    if cover is not None:  # a cached block already holds these tokens' KV
                        kept.append(cover)
                        covered += len(tokens)
                        break
                if blk is None or blk.tier == 2:
                    if chain_bytes + last_nbytes > self.capacity_bytes:
                        break  # blocks of one engine are the same size: the next one cannot fit
                    payload, nbytes = payload_for_block(i)
                    if chain_bytes + nbytes > self.capacity_bytes:
                        break
                    if blk is not None:  # recomputed anyway: the fresh copy replaces tier 2's
                        self.tiers.forget(h)
                    blk = self._add(h, parent, tokens, payload, nbytes)
                    added += 1
                chain_bytes += blk.nbytes
                last_nbytes = blk.nbytes
                kept.append(h)
                covered += len(tokens)
                parent = h
            self.index.touch(kept, self.clock())
            if session:
                last = tuple(token_ids[(len(kept) - 1) * bs : covered]) if kept else ()
                self.book.set_chain(session, kept, covered, last)
            self.tiers.evict(protect=frozenset(kept))  # never this request's own chain (it fits: see above)
        return added

    def _add(self, h: bytes, parent: bytes, tokens: tuple[int, ...], payload: Any, nbytes: int) -> Block:
        for dup in self.index.duplicates_of(parent, tokens):
            self.tiers.forget(dup)
        return self.index.link(h, parent, tokens, payload, nbytes, self.clock())

    # -- sessions -----------------------------------------------------------------
    def reply_finished(
        self, session: str, tool_names: Sequence[str] = (), *, if_running: bool = False
    ) -> None:
        """The session's reply ended: it now waits on ``tool_names`` (or on a person if none);
        ``if_running``: only if the session's state was not set since its request began."""
        if session and self.enabled:
            with self._lock:
                self.book.reply_finished(session, tool_names, self.clock(), if_running=if_running)

    def request_arrived(self, session: str) -> None:
        """A request of the session arrived and may wait before its prefill: from now on its blocks
        are kept as a running session's, and its pause ends here (retention.py: events first)."""
        if session and self.enabled:
            with self._lock:
                self.book.arrived(session, self.clock())

    def end_session(self, session: str) -> None:
        """The session is over: its blocks are the first to go."""
        with self._lock:
            self.book.end(session)

    def last_lookup(self, session: str) -> LookupReport | None:
        """The report of the session's latest lookup (see sessions.py; diagnostics read it)."""
        with self._lock:
            return self.book.last(session)

    # -- introspection ----------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Counters and gauges for /metrics (``agentserve_engine_prefix_cache_*``; see sessions.py)."""
        with self._lock:
            return cache_metrics(
                self.counters,
                self.index.used_bytes,
                len(self.index),
                self.tiers.evictions,
                len(self.index.blocks),
                self.tiers.tier2_bytes,
            )

    def clear(self) -> None:
        with self._lock:
            self.index.clear()
            if self.tiers.tier2 is not None:
                self.tiers.tier2.clear()
