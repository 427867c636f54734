"""least_loaded: the healthy worker with the fewest in-flight requests (comparison baseline).

Algorithm
  Sort healthy workers by in-flight count; ties are broken by a rotating start
  (round-robin among equals) so an idle cluster spreads requests rather than
  piling them on worker 0. The session key is ignored: best for queueing delay,
  blind to where a session's cache lives. The sorted list is the failover order.

Knobs: none.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from server.config import RoutingSettings
from server.routing.policy import Selection, WorkerLoad
from server.routing.request import RouteRequest


class LeastLoadedPolicy:
    name = "least_loaded"
    uses_prefix = False

    def __init__(self) -> None:
        self._counter = itertools.count()

    def select_worker(self, request: RouteRequest, workers: Sequence[WorkerLoad]) -> Selection | None:
        n = len(workers)
        healthy = [i for i, w in enumerate(workers) if w.healthy]
        if not healthy:
            return None
        start = next(self._counter) % n
        order = sorted(healthy, key=lambda i: (workers[i].in_flight, (i - start) % n))
        return Selection(tuple(order), "none")


def make(settings: RoutingSettings) -> LeastLoadedPolicy:
    return LeastLoadedPolicy()
