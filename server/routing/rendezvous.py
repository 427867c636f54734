"""affinity, prefix_affinity, prefix: rendezvous (highest-random-weight) orders with bounded load.

Orders (each a ranking of every worker; its first healthy worker is the *home*)
  score(key, w) = first 8 bytes (big-endian) of sha256(w.id + "\\0" + key); R(key) = the
  workers by score, highest first (ties: smaller id first). Stable across processes and
  Python versions (never ``hash()``), so router replicas with the same worker ids agree
  with no shared state. Removing a worker moves only the keys whose home it was (each to
  the next worker in its own order); adding it back moves exactly those keys home again.

  affinity         O = R(S), S = the session key (tenant-namespaced).
  prefix           O = R(P), P = the prefix hash (leading system messages + tools): every
                   session of an agent has one order (SGLang-like, comparison baseline).
  prefix_affinity  O(P, S) = R(P) cut into bands of k, 2k, 4k, ... workers (k =
                   ``prefix_spread``), each band re-sorted by score(S, .), bands kept in
                   R(P)'s order. So: with k = 1 a session's first choice IS the prefix's
                   first choice (a new session lands where its agent's system prompt and
                   tools already are); with k > 1 an agent's sessions share out its first
                   k prefix workers evenly; spills go in the prefix's own order, band by
                   band (onto the next workers that hold, or will hold, that prefix).
                   O depends only on (P, S), both of which are the same on every turn of a
                   session (the context is append-only), so turn 1 and turn 2 walk the same
                   order: a session moves between turns only when bounded load (below)
                   skips a worker it chose before, or a worker leaves.

Bounded load (Mirrokni et al., "Consistent Hashing with Bounded Loads")
  Over the n healthy workers, with T = their in-flight requests + 1 (the new one),
      cap = max(load_floor, ceil((1 + load_epsilon) * T / n))
  and a worker takes the request only if its in-flight + 1 <= cap. Walk O (healthy workers
  only) and take the first that fits. Since n * cap >= T some worker always fits; a single
  worker, or an idle cluster, never spills. The rest of O is the failover order.

Workers joining / leaving
  A worker that leaves drops out of every order: keys (prefixes, sessions) whose home it
  was move to their next worker; nobody else moves. A worker that joins takes the rank its
  score gives it in every order: it becomes the home of ~1/n of the keys. Slow start: for
  ``slow_start_s`` after a worker (re)joins, only sessions' first turns may go to it
  (``new_session``: the body has no assistant message yet); established sessions skip it
  and stay where their context is, so a join (or a recovery with an empty cache) moves no
  live session, only those still running when the slow start ends. For prefix_affinity
  a join or leave shifts the band boundaries of the prefixes that rank it inside their first
  bands, so a few of those sessions change band (and move); sessions of other prefixes stay.

Turn-graded bound (``load_epsilon_new``)
  What a spill costs depends on what the session has on its worker: a first turn has only the
  agent's prefix there (nothing, or a copy that other workers hold too), a turn-20 request has
  its whole history. So the bound is graded by the request's turn t (its assistant messages,
  counted from the body: the request alone says it, every replica counts alike):
      eps(t) = min(load_epsilon, load_epsilon_new * 2**t)
  A first turn spills past 1.1 x the mean (eps_new 0.1), a second past 1.2x, ... and an old
  session only past (1 + load_epsilon) x the mean. Young sessions are cheap to place and
  keep the fleet level; old ones stay where their KV is. A young session that spilled and
  comes back to a home that has room again moves back, which costs it one or two turns of
  context: the fleet simulation (benchmarks/results/fleet_sim.md) weighs this against the
  balance it buys. ``load_epsilon_new`` None (or >= load_epsilon) = one flat bound.

Knobs (RoutingSettings): load_epsilon (how far above the mean a worker may go; 0 = strict),
load_epsilon_new (first turns' bound, doubled per turn), load_floor (never spill from a worker
that would hold at most this many), prefix_spread (k).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from functools import lru_cache

from server.config import RoutingSettings
from server.routing.policy import Outcome, Selection, WorkerLoad
from server.routing.request import RouteRequest


def score(key: str, worker_id: str) -> int:
    """The worker's rendezvous weight for this key (stable, uniform over 64 bits)."""
    digest = hashlib.sha256(f"{worker_id}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rendezvous_order(key: str, worker_ids: Sequence[str]) -> list[int]:
    """Indices of ``worker_ids`` in the key's rendezvous order (home first)."""
    return list(_order(key, tuple(worker_ids)))


@lru_cache(maxsize=16384)
def _order(key: str, worker_ids: tuple[str, ...]) -> tuple[int, ...]:
    scores = [score(key, wid) for wid in worker_ids]
    return tuple(sorted(range(len(worker_ids)), key=lambda i: (-scores[i], worker_ids[i])))


def banded_order(prefix: str, key: str, worker_ids: Sequence[str], spread: int) -> list[int]:
    """O(P, S): the prefix's order in bands of spread, 2*spread, 4*spread, ... workers, each band
    re-sorted by the session key's scores (see the header)."""
    return list(_banded(prefix, key, tuple(worker_ids), spread))


@lru_cache(maxsize=16384)
def _banded(prefix: str, key: str, worker_ids: tuple[str, ...], spread: int) -> tuple[int, ...]:
    ranked = _order(prefix, worker_ids)
    out: list[int] = []
    start, size = 0, spread
    while start < len(ranked):
        band = ranked[start : start + size]
        out += sorted(band, key=lambda i: (-score(key, worker_ids[i]), worker_ids[i]))
        start, size = start + size, size * 2
    return tuple(out)


def load_cap(in_flight: Sequence[int], epsilon: float, floor: int = 1) -> int:
    """Most requests a worker may hold after taking a new one (see the header)."""
    total = sum(in_flight) + 1
    bound = math.ceil((1.0 + epsilon) * total / len(in_flight) - 1e-9)  # 1e-9: float noise
    return max(floor, bound)


def bounded_pick(
    ranked: Sequence[int], workers: Sequence[WorkerLoad], epsilon: float, floor: int, new_session: bool = True
) -> Selection | None:
    """Walk ``ranked`` (an order over every worker) under the load bound; a session past its first
    turn skips warming workers (slow start), unless no other worker is healthy."""
    healthy = [i for i in ranked if workers[i].healthy]
    if not new_session:
        healthy = [i for i in healthy if not workers[i].warming] or healthy
    if not healthy:
        return None
    cap = load_cap([workers[i].in_flight for i in healthy], epsilon, floor)
    chosen = next(i for i in healthy if workers[i].in_flight + 1 <= cap)
    outcome: Outcome
    if chosen == ranked[0]:
        outcome = "kept"
    elif chosen == healthy[0]:
        outcome = "moved"
    else:
        outcome = "spilled"
    return Selection((chosen, *[i for i in healthy if i != chosen]), outcome)


def graded_epsilon(epsilon: float, epsilon_new: float | None, turns: int) -> float:
    """The bound for a request of a session at turn ``turns`` (0 = its first): see the header."""
    if epsilon_new is None:
        return epsilon
    return min(epsilon, epsilon_new * 2.0 ** min(turns, 60))


class RendezvousPolicy:
    """affinity: the session key's order."""

    name = "affinity"
    uses_prefix = False

    def __init__(
        self, load_epsilon: float = 0.25, load_floor: int = 1, load_epsilon_new: float | None = None
    ) -> None:
        if load_epsilon < 0 or load_floor < 1 or (load_epsilon_new is not None and load_epsilon_new < 0):
            raise ValueError(
                f"need load_epsilon >= 0, load_epsilon_new >= 0 and load_floor >= 1, got {load_epsilon}, "
                f"{load_epsilon_new}, {load_floor}"
            )
        self.load_epsilon = load_epsilon
        self.load_floor = load_floor
        self.load_epsilon_new = load_epsilon_new

    def order(self, key: str, prefix: str | None, worker_ids: Sequence[str]) -> Sequence[int]:
        return _order(key, tuple(worker_ids))

    def select_worker(self, request: RouteRequest, workers: Sequence[WorkerLoad]) -> Selection | None:
        ranked = self.order(request.key, request.prefix, [w.id for w in workers])
        turns = 60 if request.turns is None else request.turns  # unknown: treated as established
        eps = graded_epsilon(self.load_epsilon, self.load_epsilon_new, turns)
        return bounded_pick(ranked, workers, eps, self.load_floor, request.new_session)


class PrefixPolicy(RendezvousPolicy):
    """prefix: the prefix's order for every session of an agent (no key: the session key's)."""

    name = "prefix"
    uses_prefix = True

    def order(self, key: str, prefix: str | None, worker_ids: Sequence[str]) -> Sequence[int]:
        return _order(prefix or key, tuple(worker_ids))


class PrefixAffinityPolicy(RendezvousPolicy):
    """prefix_affinity: O(P, S), the prefix's order in bands, each band in the session's order."""

    name = "prefix_affinity"
    uses_prefix = True

    def __init__(
        self,
        load_epsilon: float = 0.25,
        load_floor: int = 1,
        spread: int = 1,
        load_epsilon_new: float | None = None,
    ) -> None:
        super().__init__(load_epsilon, load_floor, load_epsilon_new)
        if spread < 1:
            raise ValueError(f"need prefix_spread >= 1, got {spread}")
        self.spread = spread

    def order(self, key: str, prefix: str | None, worker_ids: Sequence[str]) -> Sequence[int]:
        if prefix is None:
            return _order(key, tuple(worker_ids))
        return _banded(prefix, key, tuple(worker_ids), self.spread)


def make(settings: RoutingSettings) -> RendezvousPolicy:
    return RendezvousPolicy(settings.load_epsilon, settings.load_floor, settings.load_epsilon_new)


def make_prefix(settings: RoutingSettings) -> PrefixPolicy:
    return PrefixPolicy(settings.load_epsilon, settings.load_floor, settings.load_epsilon_new)


def make_prefix_affinity(settings: RoutingSettings) -> PrefixAffinityPolicy:
    return PrefixAffinityPolicy(
        settings.load_epsilon, settings.load_floor, settings.prefix_spread, settings.load_epsilon_new
    )
