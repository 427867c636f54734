"""What the prefix cache knows per session, and what it reports (for /metrics and cache-miss reasons).

``SessionBook`` keeps, per session key, the chain of blocks of its latest prompt + reply
and what it is doing (``retention.SessionRecords``), learns pauses when a session comes
back, and writes one ``LookupReport`` per lookup. This is the API the cache-miss
diagnostics read (``PrefixCache.last_lookup(session_key)``, ``HFEngine.lookup_report``):

- ``state``: what the session was doing when the request came (new | running | tool |
  person | done; done = ended, or idle past its cap);
- ``waiting_on`` / ``waited_s``: the tools its last reply called (``("person",)`` after a
  text reply) and how long it had waited;
- ``kept_tokens``: tokens of its previous prompt + reply this prompt still starts with;
- ``evicted_tokens``: of those (up to the last prompt token), how many were in neither
  tier and had to be recomputed; ``tier2_tokens``: how many came back from tier 2.

``CacheCounters`` are the cache's counters; ``PrefixCache.stats()`` names them for /metrics.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from server.kvcache.retention import PERSON, SessionRecord, SessionRecords


@dataclass(frozen=True)
class LookupReport:
    """One lookup of a session's prompt, for cache-miss diagnostics."""

    session_key: str
    prompt_tokens: int
    cached_tokens: int
    tier2_tokens: int  # of cached_tokens, restored from tier 2
    kept_tokens: int  # tokens of the session's previous prompt + reply that still prefix this prompt
    evicted_tokens: int  # of kept_tokens (up to the last prompt token), gone from both tiers
    state: str  # what the session was doing when this request came: new | running | tool | person | done
    waiting_on: tuple[str, ...]  # tool names it waited on; ("person",) after a text reply
    waited_s: float | None  # seconds since its last reply ended (None: new or still running)


@dataclass
class CacheCounters:
    hit_tokens_tier1: int = 0
    hit_tokens_tier2: int = 0
    tail_hit_tokens: int = 0  # tokens served from partial blocks (tails and partly matching blocks)
    blocks_restored: int = 0
    bytes_to_tier2: int = 0
    bytes_from_tier2: int = 0
    restores_skipped: int = 0  # tier-2 hits not restored: recomputing was measured cheaper
    tier2_faults: int = 0  # corrupted or missing tier-2 blocks (treated as misses)
    sessions_back_intact: int = 0  # sessions back from a pause with their whole prefix in tier 1
    sessions_back_evicted: int = 0  # ... with part of it evicted (recomputed, or restored from tier 2)


def cache_metrics(
    c: CacheCounters, nbytes: int, blocks: int, evictions: int, all_blocks: int, tier2_bytes: int
) -> dict[str, float]:
    """The /metrics view: ``prefix_cache_<name>`` -> value (hits per tier, restores, bytes moved...)."""
    out = {
        "bytes": nbytes,
        "blocks": blocks,
        "evictions": evictions,
        "tier2_bytes": tier2_bytes,
        "tier2_blocks": all_blocks - blocks,
        **{k: v for k, v in vars(c).items()},
    }
    return {f"prefix_cache_{k}": float(v) for k, v in out.items()}


@dataclass(frozen=True)
class _Before:
    state: str
    waiting_on: tuple[str, ...]
    waited_s: float | None
    kept_tokens: int


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SessionBook:
    def __init__(self, capacity: int, cap_s: float, block_size: int, counters: CacheCounters) -> None:
        self.sessions = SessionRecords(capacity, cap_s)
        self.block_size = block_size
        self.counters = counters
        self._reports: OrderedDict[str, LookupReport] = OrderedDict()

    def set_chain(self, session: str, kept: list[bytes], covered: int, tail: tuple[int, ...]) -> None:
        s, _ = self.sessions.touch(session)
        s.chain, s.chain_tokens, s.tail_tokens = list(kept), covered, tail

    def begin(
        self,
        session: str,
        token_ids: Sequence[int],
        hashes: Callable[[Sequence[int]], list[bytes]],
        now: float,
        retain_s: float = 0.0,
    ) -> _Before:
        """What the session was doing before this request (learns its pause); marks it running,
        with this request's retention hint (``retain_s``) for the pause after its reply."""
        s = self.sessions.get(session)
        if s is None:
            before = _Before("new", (), None, 0)
        else:
            back = now if s.arrived is None else s.arrived  # the pause ended when the request arrived
            state = "done" if s.state != "running" and self.sessions.expired(s, back) else s.state
            waited = None if s.state == "running" else back - s.since
            before = _Before(state, s.waiting_on, waited, self._kept_tokens(s, token_ids, hashes))
            if s.state in ("tool", "person"):
                self.sessions.pauses.observe(s.waiting_on, back - s.since)
        s, _ = self.sessions.touch(session)
        if s.state in ("tool", "person"):
            s.last_wait = s.waiting_on
        s.state, s.waiting_on, s.since, s.keep_s, s.arrived = "running", (), now, retain_s, None
        return before

    def report(
        self, session: str, before: _Before, n_prompt: int, cached: int, tier2_tokens: int
    ) -> LookupReport:
        kept = before.kept_tokens
        evicted = max(0, min(kept, n_prompt - 1) - cached)
        if before.state in ("tool", "person", "done") and kept:
            if evicted or tier2_tokens:
                self.counters.sessions_back_evicted += 1
            else:
                self.counters.sessions_back_intact += 1
        r = LookupReport(
            session,
            n_prompt,
            cached,
            tier2_tokens,
            kept,
            evicted,
            before.state,
            before.waiting_on,
            before.waited_s,
        )
        self._reports[session] = r
        self._reports.move_to_end(session)
        while len(self._reports) > self.sessions.capacity:
            self._reports.popitem(last=False)
        return r

    def _kept_tokens(
        self, s: SessionRecord, token_ids: Sequence[int], hashes: Callable[[Sequence[int]], list[bytes]]
    ) -> int:
        bs = self.block_size
        n_full = s.chain_tokens // bs
        hs = hashes(token_ids[: n_full * bs])
        for i in range(n_full):
            if i >= len(hs) or i >= len(s.chain) or hs[i] != s.chain[i]:
                return i * bs
        rest = s.chain_tokens - n_full * bs
        return n_full * bs + (_lcp(s.tail_tokens[:rest], token_ids[n_full * bs :]) if rest else 0)

    def reply_finished(
        self, session: str, tool_names: Sequence[str], now: float, *, if_running: bool = False
    ) -> None:
        """The reply ended: the session waits on ``tool_names`` (or a person). ``if_running``: only
        when nobody said so yet for this turn (the engine's default must not overwrite the service's
        word, which can arrive first: the final chunk is emitted before the engine retains the KV)."""
        s, _ = self.sessions.touch(session)
        if if_running and s.state != "running":
            return
        s.state = "tool" if tool_names else "person"
        s.waiting_on = tuple(tool_names) if tool_names else (PERSON,)
        s.since = now

    def arrived(self, session: str, now: float) -> None:
        """A request of the session arrived (before its prefill): the session is back."""
        s = self.sessions.get(session)
        if s is not None and s.state in ("tool", "person") and s.arrived is None:
            if not self.sessions.expired(s, now):
                s.arrived = now

    def end(self, session: str) -> None:
        s = self.sessions.get(session)
        if s is not None:
            s.state, s.chain = "done", []

    def last(self, session: str) -> LookupReport | None:
        return self._reports.get(session)
