"""Prometheus metrics of a worker (its own registry, so several apps can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "agentserve_requests", "Requests by endpoint and HTTP status", ["endpoint", "status"], registry=r
        )
        self.ttft = Histogram(
            "agentserve_time_to_first_token_seconds", "Time to first token", buckets=TTFT_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "agentserve_request_duration_seconds", "Request duration", buckets=TTFT_BUCKETS, registry=r
        )
        self.prefix_queries = Counter(
            "agentserve_prefix_cache_queries_tokens",
            "Prompt tokens looked up in the prefix cache",
            registry=r,
        )
        self.prefix_hits = Counter(
            "agentserve_prefix_cache_hits_tokens", "Prompt tokens served from the prefix cache", registry=r
        )
        self.prompt_tokens = Counter("agentserve_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("agentserve_generation_tokens", "Tokens generated", registry=r)
        self.cache_misses = Counter(
            "agentserve_cache_misses",
            "Requests whose prompt missed the cache, by reason type (docs/cache.md)",
            ["type"],
            registry=r,
        )
        self.cache_missed_tokens = Counter(
            "agentserve_cache_missed_tokens",
            "Prompt tokens recomputed because of a cache miss, by reason type",
            ["type"],
            registry=r,
        )
        self.running = Gauge("agentserve_requests_running", "Requests being generated", registry=r)

        self._engine_gauges: dict[str, Gauge] = {}

    def observe_cache(self, miss_type: str | None, missed_tokens: int | None) -> None:
        """Count one request's cache diagnosis (nothing when it reused all it could)."""
        if miss_type is None:
            return
        self.cache_misses.labels(miss_type).inc()
        self.cache_missed_tokens.labels(miss_type).inc(missed_tokens or 0)

    def engine_gauge(self, name: str) -> Gauge:
        """A gauge mirroring one engine statistic (prefix cache bytes, blocks, evictions...)."""
        if name not in self._engine_gauges:
            self._engine_gauges[name] = Gauge(
                f"agentserve_engine_{name}", f"Engine statistic {name}", registry=self.registry
            )
        return self._engine_gauges[name]

    def render(self) -> bytes:
        return generate_latest(self.registry)
