"""Session-aware retention for the prefix cache: which tier-1 blocks to evict first.

The cache tells this module, per session (the request's session key), the chain of
blocks of its latest prompt + reply and what the session is doing:

- ``running``: a request of the session is being served;
- ``tool``: its last reply ended with tool calls (``waiting_on`` = the tool names);
- ``person``: its last reply ended with text (a person reads it and answers);
- ``done``: ended explicitly, or idle past its cap: it holds nothing any more.

Eviction order (``session`` policy), first evicted first:
1. blocks no live session holds (finished sessions, superseded branches, duplicated
   tails), least recently used first;
2. blocks of sessions by their *hit density*, lowest first, each chain from its tail: the
   chance the session is back before an unused block would leave tier 1 anyway (the cache's
   turnover time: the age of its least recently used block, ``BlockIndex.lru_age``) per second
   of memory it holds until then (``PauseEstimator.hit_density``; after LHD, Beckmann et al.,
   NSDI'18). Equal densities (e.g. none can be back in time): the latest expected back first,
   then the least recently active. A block shared by several sessions counts for the one worth
   most. (Until 2026-11-27 sessions were ranked by expected time to return alone: a mean
   that the 10-minute tail of people's pauses dominates, though half of them answer within
   20 s; with more memory (0.9M tokens, 32 users, traces 601-739) ``session`` lost to ``lru``
   by 0.55 points: benchmarks/results/cc_traces.md. When every pause ends within the horizon
   the density is 1 / the expected time to return: the same ranking.)

A *running* session is ranked by when the cache's copy of its KV is next needed: while its
reply runs the engine holds that KV itself (the request's matched payloads and its own KV,
which the engine inserts again when the reply ends), so the copy is needed at its next
request, after the pause that follows the reply: ranked as ``remaining(last wait, 0)``, the
pause of what it waited on before this request (0 before any). Never evicted: the chain a
request is inserting (``PrefixCache.insert`` protects it; ``match`` protects what it
restores). A session whose next request has arrived ranks first (-1). (Until 2026-11-26 a
running session ranked first until its reply ended: with ~half of 32 Claude Code users
running, their chains filled the budget and sessions in a 10 s tool pause went first;
``session`` lost to ``lru``: benchmarks/results/cc_traces.md.)

Time to return = the expected *remaining* pause given how long the session has already
waited: over the recent pauses observed for what it waits on (per tool name; "person" for
a text reply), the mean of (pause - waited) among those longer than the wait so far. A
session about to be back is kept first. One that has waited longer than every pause seen
is taken to be gone (``cap_s`` away). Before any pause of that tool was seen: |default
pause - waited|. (Until 2026-11-23 it was |EMA of the pauses - waited| for everyone: with
pauses spread from 0.5 to 30 s that ranked a shell call 20 s in, which is nearly back, as
far away, and the policy did no better than LRU: benchmarks/results/kv_pressure.md.)
Pauses are learned from what the server sees (the time between a reply and the
session's next request), capped at ``cap_s``: an exponential moving average per tool (for
expiry) and the last ``PAUSE_SAMPLES`` pauses per tool (for the time to return). A session
idle for longer than ``min(cap_s, max(EXPIRE_FACTOR x its expected pause, keep_s))`` counts as
done: no session holds memory forever. ``keep_s`` is the client's retention hint of its latest
request (Anthropic ``cache_control`` ttl, OpenAI ``prompt_cache_retention``; 0 without one).

Events come first: a session whose next request has arrived (``request_arrived``: the
request may wait for the engine, for long on a loaded or slowed server) is back, whatever
the clock says; its pause ended at the arrival (what is learned). Without that event, a
session queued behind slow requests looked as if it had waited longer than every pause seen,
and went first (issue 38: 416 of 1,732 tokens kept while two newer sessions passed).

Time comes from an injected clock (virtual in tests and benchmarks); nothing here
touches the prompt.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

PERSON = "person"  # the "tool" a text reply waits on
DEFAULT_TOOL_PAUSE_S = 10.0
DEFAULT_PERSON_PAUSE_S = 60.0
EMA_ALPHA = 0.3
EXPIRE_FACTOR = 4.0
PAUSE_SAMPLES = 64  # recent pauses kept per tool name
MIN_HORIZON_S = 1e-3  # floor of the horizon and of a held time (seconds): no division by zero
MAX_TOOLS_TRACKED = 1024  # tool names with pause statistics (clients name tools: least recent dropped)


class PauseEstimator:
    """Per tool name: an exponential moving average of observed pauses (seconds), capped."""

    def __init__(self, cap_s: float) -> None:
        self.cap_s = cap_s
        self._ema: OrderedDict[str, float] = OrderedDict()
        self._recent: dict[str, deque[float]] = {}
        self.observations = 0

    def observe(self, waiting_on: Iterable[str], pause_s: float) -> None:
        pause = min(max(pause_s, 0.0), self.cap_s)
        for name in waiting_on:
            prev = self._ema.get(name)
            if prev is not None:
                self._ema.move_to_end(name)
            elif len(self._ema) >= MAX_TOOLS_TRACKED:
                old, _ = self._ema.popitem(last=False)
                self._recent.pop(old, None)
            self._ema[name] = pause if prev is None else (1 - EMA_ALPHA) * prev + EMA_ALPHA * pause
            self._recent.setdefault(name, deque(maxlen=PAUSE_SAMPLES)).append(pause)
            self.observations += 1

    def remaining(self, waiting_on: Iterable[str], waited_s: float) -> float:
        """Expected seconds until a session that has waited ``waited_s`` on ``waiting_on`` is back
        (parallel calls: the longest); see the module header."""
        best = 0.0
        for name in waiting_on:
            seen = self._recent.get(name)
            if not seen:
                default = DEFAULT_PERSON_PAUSE_S if name == PERSON else DEFAULT_TOOL_PAUSE_S
                left = abs(min(default, self.cap_s) - waited_s)
            else:
                longer = [p - waited_s for p in seen if p > waited_s]
                left = sum(longer) / len(longer) if longer else self.cap_s
            best = max(best, left)
        return min(best, self.cap_s)

    def hit_density(self, waiting_on: Iterable[str], waited_s: float, horizon_s: float) -> float:
        """Expected hits per second of tier-1 memory held (least hit density, LHD) for a session
        that has waited ``waited_s`` on ``waiting_on``, when a block unused for ``horizon_s`` is gone
        anyway: over the recent pauses longer than the wait, P(back within the horizon) / E[seconds
        held until back or gone]. 0: longer than every pause seen. Parallel calls: the slowest name's."""
        h = max(horizon_s, MIN_HORIZON_S)
        worst = float("inf")
        for name in waiting_on:
            seen = self._recent.get(name)
            if not seen:
                default = DEFAULT_PERSON_PAUSE_S if name == PERSON else DEFAULT_TOOL_PAUSE_S
                left = [abs(min(default, self.cap_s) - waited_s)]
            else:
                left = [p - waited_s for p in seen if p > waited_s]
            hits = sum(1 for r in left if r <= h)
            held = sum(min(r, h) for r in left)
            worst = min(worst, hits / max(held, MIN_HORIZON_S))
        return worst

    def expected(self, waiting_on: Iterable[str]) -> float:
        """The expected pause of a wait on all of ``waiting_on`` (they may run in parallel: the max)."""
        best = 0.0
        for name in waiting_on:
            default = DEFAULT_PERSON_PAUSE_S if name == PERSON else DEFAULT_TOOL_PAUSE_S
            best = max(best, self._ema.get(name, default))
        return min(best, self.cap_s)

    def snapshot(self) -> dict[str, float]:
        return dict(sorted(self._ema.items()))


@dataclass
class SessionRecord:
    key: str
    chain: list[bytes] = field(default_factory=list)  # block keys of the latest prompt + reply
    chain_tokens: int = 0
    tail_tokens: tuple[int, ...] = ()  # tokens of the chain's last block (partial or full)
    state: str = "running"  # running | tool | person | done
    waiting_on: tuple[str, ...] = ()
    since: float = 0.0  # when the last reply ended (or the request began, while running)
    keep_s: float = 0.0  # the client's retention hint (cache_control ttl, prompt_cache_retention), seconds
    arrived: float | None = None  # its next request arrived then (waiting for the engine): it is back
    last_wait: tuple[str, ...] = ()  # what it waited on before its current request (kept while running)


class SessionRecords:
    """Bounded table of sessions (least recently active dropped first) + the pause estimator."""

    def __init__(self, capacity: int, cap_s: float) -> None:
        self.capacity = capacity
        self.cap_s = cap_s
        self.pauses = PauseEstimator(cap_s)
        self._items: OrderedDict[str, SessionRecord] = OrderedDict()

    def get(self, key: str) -> SessionRecord | None:
        return self._items.get(key)

    def touch(self, key: str) -> tuple[SessionRecord, list[SessionRecord]]:
        """The session (created if new), most recently active; plus sessions dropped past capacity."""
        s = self._items.get(key)
        if s is None:
            s = self._items[key] = SessionRecord(key)
        self._items.move_to_end(key)
        dropped = []
        while len(self._items) > self.capacity:
            dropped.append(self._items.popitem(last=False)[1])
        return s, dropped

    def values(self) -> list[SessionRecord]:
        return list(self._items.values())

    def expired(self, s: SessionRecord, now: float) -> bool:
        if s.state == "done":
            return True
        if s.arrived is not None:  # a request that never reached the engine holds it cap_s at most
            return now - s.arrived > self.cap_s
        if s.state == "running":
            return False
        limit = min(self.cap_s, max(EXPIRE_FACTOR * max(self.pauses.expected(s.waiting_on), 1e-3), s.keep_s))
        return now - s.since > limit

    def time_to_return(self, s: SessionRecord, now: float) -> float:
        """Expected seconds until the session's KV is next needed, given how long it has waited;
        see the module header. -1: its request has arrived and waits for the engine. Running:
        the pause it will take after its reply, as its last one (0 before any)."""
        if s.arrived is not None:
            return -1.0
        if s.state == "running":
            return self.pauses.remaining(s.last_wait, 0.0) if s.last_wait else 0.0
        return self.pauses.remaining(s.waiting_on, now - s.since)

    def keep_value(self, s: SessionRecord, now: float, horizon_s: float) -> float:
        """How much the session's tier-1 blocks are worth keeping (higher: kept longer): the hit
        density of its pause (``PauseEstimator.hit_density``) over the cache's ``horizon_s``.
        Arrived: infinite. Running: its next pause, as its last one, from 0 s (infinite before any)."""
        if s.arrived is not None:
            return float("inf")
        if s.state == "running":
            return self.pauses.hit_density(s.last_wait, 0.0, horizon_s) if s.last_wait else float("inf")
        return self.pauses.hit_density(s.waiting_on, now - s.since, horizon_s)

    def __len__(self) -> int:
        return len(self._items)


def session_eviction_order(
    tier1: Mapping[bytes, object],
    lru: Iterable[bytes],
    sessions: SessionRecords,
    now: float,
    horizon_s: float = 0.0,
) -> list[bytes]:
    """Tier-1 block keys in the order the ``session`` policy evicts them.

    ``lru`` lists the tier-1 keys least recently used first (a chain's tail before its head).
    ``horizon_s``: the cache's turnover time (``BlockIndex.lru_age``), for ``SessionRecords.keep_value``.
    """
    live = [
        (-sessions.keep_value(s, now, horizon_s), sessions.time_to_return(s, now), -s.since, i, s)
        for i, s in enumerate(sessions.values())
        if not sessions.expired(s, now) and s.chain
    ]
    # most needed first: each block is claimed by the first (most valuable) session holding it
    live.sort(key=lambda x: x[:4])
    claim: dict[bytes, tuple[float, float, float, int]] = {}
    for neg_value, ttr, _, _, s in live:
        for depth in range(len(s.chain) - 1, -1, -1):
            h = s.chain[depth]
            if h in claim:
                break  # this block and its ancestors were claimed by a session worth more
            claim[h] = (-neg_value, -ttr, s.since, depth)
    unowned = [h for h in lru if h not in claim]
    owned = [h for h in claim if h in tier1]
    # least value first; equal values (none back within the horizon): the latest to return, then the
    # least recently active session (LRU); each from its tail
    owned.sort(key=lambda h: (*claim[h][:3], -claim[h][3]))
    return unowned + owned
