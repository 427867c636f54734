"""The routing policy interface: what a policy sees and what it answers.

A policy answers one question: given a request (``RouteRequest``: session key, prefix hash,
turn) and the current workers (health, in-flight count), which worker serves it, and in which
order to try the others if that one cannot be reached. Policies are pure and synchronous; the
router owns health, in-flight counting and retries.

The policies are named in one table, ``server/routing/policies.py`` (``make_policy(settings)``
builds the configured one); the router, the benchmarks and the fleet simulation build them only
that way (by name). A policy module imports this one, never the table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from server.config import RoutingSettings
from server.routing.request import RouteRequest

Outcome = Literal["kept", "moved", "spilled", "none"]


@dataclass(slots=True)
class WorkerLoad:
    """What a policy sees of one worker: a snapshot per request, which policies only read (not
    frozen: a frozen dataclass costs ~5x as much to build, and the router builds one per worker
    per request)."""

    id: str
    healthy: bool
    in_flight: int
    warming: bool = False  # (re)joined less than routing.slow_start_s ago: takes new sessions only


@dataclass(slots=True)
class Selection:
    """A policy's answer: indices into the workers it was given, chosen first.

    ``order[0]`` serves the request; ``order[1:]`` are tried in turn when the chosen
    worker cannot be reached before anything was sent to the client. Only healthy
    workers appear. ``outcome`` says how the choice relates to the session's home:
    kept (its home worker), moved (home is down: next in its order), spilled (home
    or more were over the load bound), none (the policy has no notion of home).
    Not frozen, for the same reason as ``WorkerLoad``: it is built on every request.
    """

    order: tuple[int, ...]
    outcome: Outcome

    @property
    def worker(self) -> int:
        return self.order[0]


class RoutingPolicy(Protocol):
    name: str
    uses_prefix: bool  # places by the prefix hash: the proxy computes ``RouteRequest.prefix`` only then

    def select_worker(self, request: RouteRequest, workers: Sequence[WorkerLoad]) -> Selection | None:
        """The selection for ``request`` (``server/routing/request.py``: the session's placement
        key; its prefix hash when ``uses_prefix``; its turn: a first turn may go to a warming
        worker, and the load bound may be graded by what a spill would cost); None when no worker
        is healthy."""
        ...


PolicyFactory = Callable[[RoutingSettings], RoutingPolicy]
