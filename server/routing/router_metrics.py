"""The router's Prometheus metrics, in their own CollectorRegistry (one per router app)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from server.routing.workers import WorkerPool

# added latency: what the router itself adds, from well under a millisecond to tens
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


class _PoolCollector(Collector):
    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[GaugeMetricFamily]:
        healthy = GaugeMetricFamily(
            "agentserve_router_worker_healthy", "1 if the worker is in rotation", labels=["worker"]
        )
        in_flight = GaugeMetricFamily(
            "agentserve_router_worker_in_flight",
            "Requests the router has open on the worker",
            labels=["worker"],
        )
        for w in self.pool.workers:
            healthy.add_metric([w.id], float(w.healthy))
            in_flight.add_metric([w.id], float(w.in_flight))
        yield healthy
        yield in_flight


class RouterMetrics:
    def __init__(self, pool: WorkerPool) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "agentserve_router_requests",
            "Proxied requests by worker and HTTP status",
            ["worker", "status"],
            registry=r,
        )
        self.affinity = Counter(
            "agentserve_router_affinity",
            "Session placements: kept (home worker), moved (home down), spilled (over the load bound), "
            "none (policy without affinity)",
            ["outcome"],
            registry=r,
        )
        self.failovers = Counter(
            "agentserve_router_failovers",
            "Requests retried on another worker after this one failed before anything reached the client",
            ["worker"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "agentserve_router_upstream_errors",
            "Worker failures by kind: connect, disconnect, timeout, status_5xx, midstream; "
            "no_worker when none was healthy",
            ["worker", "kind"],
            registry=r,
        )
        self.added_latency = Histogram(
            "agentserve_router_added_latency_seconds",
            "Time the router adds to a request: before forwarding it and after the worker's answer "
            "(its first chunk when streaming) arrived",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        r.register(_PoolCollector(pool))
        # labelled children, remembered: labels() locks and validates its arguments on every call
        self._requests: dict[tuple[str, str], Counter] = {}
        self._placed: dict[str, Counter] = {}

    def request_done(self, worker_id: str, status: str) -> None:
        child = self._requests.get((worker_id, status))
        if child is None:
            child = self._requests[(worker_id, status)] = self.requests.labels(worker_id, status)
        child.inc()

    def placed(self, outcome: str) -> None:
        child = self._placed.get(outcome)
        if child is None:
            child = self._placed[outcome] = self.affinity.labels(outcome)
        child.inc()
