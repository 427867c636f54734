"""round_robin: the next healthy worker in turn, ignoring the session (comparison baseline).

Algorithm
  A counter advances once per request; the chosen worker is healthy[counter % n]
  and the failover order continues around the healthy list from there. A
  session's turns land on different workers, so with n workers about 1/n of a
  session's prefix is found in the cache it hits.

Knobs: none. (Each router replica has its own counter.)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from server.config import RoutingSettings
from server.routing.policy import Selection, WorkerLoad
from server.routing.request import RouteRequest


class RoundRobinPolicy:
    name = "round_robin"
    uses_prefix = False

    def __init__(self) -> None:
        self._counter = itertools.count()

    def select_worker(self, request: RouteRequest, workers: Sequence[WorkerLoad]) -> Selection | None:
        healthy = [i for i, w in enumerate(workers) if w.healthy]
        if not healthy:
            return None
        start = next(self._counter) % len(healthy)
        return Selection(tuple(healthy[start:] + healthy[:start]), "none")


def make(settings: RoutingSettings) -> RoundRobinPolicy:
    return RoundRobinPolicy()
