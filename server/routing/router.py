"""``Router``: the state of one router process (workers, policy, metrics, upstream client, suspect
bodies, WebSocket gate) and ``plan``, the order of workers a request tries. The app that serves it is
``router_app.py``; the hot path (``proxy.py``, ``forward.py``, ``websocket.py``) reads it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from server.config import Settings
from server.errors import UpstreamUnavailable
from server.routing.clients import make_upstream
from server.routing.discovery import DnsDiscovery
from server.routing.policies import make_policy
from server.routing.policy import Outcome
from server.routing.request import RouteRequest
from server.routing.router_metrics import RouterMetrics
from server.routing.suspects import SuspectTable
from server.routing.workers import Worker, WorkerPool, WorkerSpec
from server.ws_gate import SocketGate

log = logging.getLogger("agentserve.routing")


class Router:
    """Workers, policy, metrics and the upstream client of one router process."""

    def __init__(
        self, settings: Settings, specs: Sequence[WorkerSpec], discovery: DnsDiscovery | None = None
    ) -> None:
        self.settings = settings
        rs = settings.routing
        self.pool = WorkerPool(specs, rs)
        self.policy = make_policy(rs)
        self.metrics = RouterMetrics(self.pool)
        self.upstream = make_upstream(rs.upstream, rs.connect_timeout_s, rs.read_timeout_s)
        self.discovery = discovery
        self.suspects = SuspectTable()  # request bodies workers died on (server/routing/suspects.py)
        self.sockets = SocketGate(settings)  # client WebSockets: counted, origin-checked (ws_gate.py)

    async def start(self) -> None:
        if self.discovery is not None:
            await self.discovery.start(self.pool)
        await self.pool.start()
        log.info(
            "router: policy %s over %d workers (%d healthy), upstream %s",
            self.policy.name,
            len(self.pool.workers),
            self.pool.healthy_count(),
            self.settings.routing.upstream,
        )

    async def close(self) -> None:
        if self.discovery is not None:
            await self.discovery.close()
        await self.pool.close()
        await self.upstream.close()

    def plan(self, route: RouteRequest | None) -> tuple[list[Worker], Outcome | None]:
        """Workers to try, in order, for a request (None: not placed, any worker, least loaded first)."""
        workers, tries = self.pool.workers, 1 + self.settings.routing.max_failovers
        if route is None:
            order = sorted((w for w in workers if w.healthy), key=lambda w: w.in_flight)
            outcome = None
        else:
            sel = self.policy.select_worker(route, self.pool.loads())
            order = [workers[i] for i in sel.order[:tries]] if sel else []
            outcome = sel.outcome if sel else None
        if not order:
            errors = "; ".join(f"{w.id}: {w.last_error or 'not checked yet'}" for w in workers)
            raise UpstreamUnavailable(
                f"no healthy worker: all {len(workers)} workers are out of rotation "
                f"({errors or 'none found'}); "
                "check that the workers run and answer GET /health"
            )
        return order[:tries], outcome
