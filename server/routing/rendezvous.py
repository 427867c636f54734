"""affinity: rendezvous (highest-random-weight) hashing of the session key, with bounded load.

Algorithm
  1. Rank every worker by score(key, worker) = first 8 bytes (big-endian) of
     sha256(worker.id + "\\0" + key), highest first (ties: smaller id first). The ranking
     is the session's *rendezvous order*; its first worker is the session's *home*.
     The hash is stable across processes and Python versions (never ``hash()``), so
     any number of router replicas with the same worker ids route a session to the
     same worker with no shared state. Removing a worker moves only the sessions
     whose home it was (each to the next worker in its own order, spreading them
     evenly); adding it back moves exactly those sessions home again.
  2. Bounded load (Mirrokni et al., "Consistent Hashing with Bounded Loads"):
     over the n healthy workers, with T = their in-flight requests + 1 (the new
     one), the capacity is
         cap = max(load_floor, ceil((1 + load_epsilon) * T / n))
     and a worker takes the request only if its in-flight + 1 <= cap. Walk the
     session's order (healthy workers only) and take the first that fits. Since
     n * cap >= T, some worker always fits; a single worker, or an idle cluster,
     never spills.
  3. The remaining healthy workers, in rendezvous order, are the failover order.

Knobs (RoutingSettings)
  load_epsilon  ε >= 0: how far above the mean (counting the new request) a
                worker may go before new requests of its sessions spill.
                0 = strict balance (many spills); large = pure affinity.
  load_floor    >= 1: a worker is never skipped for load while it would have at
                most this many requests in flight (absolute slack: with few
                requests in flight, ε alone would spill on tiny imbalances and
                lose the cache for nothing). 1 = the textbook bound.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from server.config import RoutingSettings
from server.routing.policy import Selection, WorkerLoad, register_policy


def score(key: str, worker_id: str) -> int:
    """The worker's rendezvous weight for this key (stable, uniform over 64 bits)."""
    digest = hashlib.sha256(f"{worker_id}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rendezvous_order(key: str, worker_ids: Sequence[str]) -> list[int]:
    """Indices of ``worker_ids`` in the session's rendezvous order (home first)."""
    scores = [score(key, wid) for wid in worker_ids]
    return sorted(range(len(worker_ids)), key=lambda i: (-scores[i], worker_ids[i]))


def load_cap(in_flight: Sequence[int], epsilon: float, floor: int = 1) -> int:
    """Most requests a worker may hold after taking a new one (see the header)."""
    total = sum(in_flight) + 1
    bound = math.ceil((1.0 + epsilon) * total / len(in_flight) - 1e-9)  # 1e-9: float noise
    return max(floor, bound)


class RendezvousPolicy:
    name = "affinity"

    def __init__(self, load_epsilon: float = 0.25, load_floor: int = 1) -> None:
        if load_epsilon < 0 or load_floor < 1:
            raise ValueError(f"need load_epsilon >= 0 and load_floor >= 1, got {load_epsilon}, {load_floor}")
        self.load_epsilon = load_epsilon
        self.load_floor = load_floor

    def select_worker(self, key: str, workers: Sequence[WorkerLoad]) -> Selection | None:
        ranked = rendezvous_order(key, [w.id for w in workers])
        healthy = [i for i in ranked if workers[i].healthy]
        if not healthy:
            return None
        cap = load_cap([workers[i].in_flight for i in healthy], self.load_epsilon, self.load_floor)
        chosen = next(i for i in healthy if workers[i].in_flight + 1 <= cap)
        if chosen == ranked[0]:
            outcome = "kept"
        elif chosen == healthy[0]:
            outcome = "moved"
        else:
            outcome = "spilled"
        return Selection((chosen, *(i for i in healthy if i != chosen)), outcome)


@register_policy("affinity")
def _make(settings: RoutingSettings) -> RendezvousPolicy:
    return RendezvousPolicy(settings.load_epsilon, settings.load_floor)
