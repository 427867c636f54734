"""The worker pool: which workers exist, which are healthy, how many requests each holds.

Health: every ``health_interval_s`` each worker gets ``GET /health`` (timeout
``health_timeout_s``); 200 = healthy. A healthy worker is taken out after
``health_failures`` consecutive failed checks, or at once when a request cannot
connect to it (``mark_down``); one successful check brings it back. Policies see
only ``WorkerLoad`` snapshots; the router counts in-flight requests here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from server.config import RoutingSettings
from server.routing.policy import WorkerLoad

log = logging.getLogger("agentserve.routing")


@dataclass(frozen=True)
class WorkerSpec:
    id: str
    url: str


def parse_worker_specs(values: Sequence[str]) -> list[WorkerSpec]:
    """``URL`` or ``ID=URL`` per worker; the id (default: the URL) feeds the rendezvous hash,
    so router replicas must use the same ids for the same workers."""
    specs: list[WorkerSpec] = []
    for value in values:
        wid, sep, url = value.partition("=")
        if not sep or "://" in wid:
            wid, url = "", value
        url = url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"worker {value!r}: expected a base URL like http://127.0.0.1:8001 (or ID=URL)")
        specs.append(WorkerSpec(wid.strip() or url, url))
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate worker ids in {ids}: give each worker its own URL or ID=URL")
    return specs


@dataclass
class Worker:
    id: str
    url: str
    healthy: bool = False
    in_flight: int = 0
    failures: int = 0
    last_error: str | None = None
    healthy_since: float = float("-inf")  # monotonic time it last came into rotation

    def info(self) -> dict[str, object]:
        return {
            "id": self.id,
            "url": self.url,
            "healthy": self.healthy,
            "in_flight": self.in_flight,
            "last_error": self.last_error,
        }


class WorkerPool:
    def __init__(self, specs: Sequence[WorkerSpec], settings: RoutingSettings) -> None:
        self.workers = [Worker(s.id, s.url) for s in specs]
        self.settings = settings
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = False  # workers healthy at the first check are warm (a router restart)

    def set_specs(self, specs: Sequence[WorkerSpec]) -> tuple[list[str], list[str]]:
        """Replace the worker list (DNS discovery); workers that stay keep their state.
        Returns (added ids, removed ids)."""
        current = {w.id: w for w in self.workers}
        wanted = {s.id for s in specs}
        added = [s.id for s in specs if s.id not in current]
        removed = [wid for wid in current if wid not in wanted]
        self.workers = [current.get(s.id) or Worker(s.id, s.url) for s in specs]
        return added, removed

    def loads(self) -> list[WorkerLoad]:
        warm_after = time.monotonic() - self.settings.slow_start_s
        # per request, over every worker: kept to one plain construction each
        return [WorkerLoad(w.id, w.healthy, w.in_flight, w.healthy_since > warm_after) for w in self.workers]

    def healthy_count(self) -> int:
        return sum(w.healthy for w in self.workers)

    def find(self, ref: str) -> Worker | None:
        """A worker by index or id."""
        if ref.isdigit() and int(ref) < len(self.workers):
            return self.workers[int(ref)]
        return next((w for w in self.workers if w.id == ref), None)

    async def start(self) -> None:
        """One round of checks (so a fresh router knows who is up), then the periodic loop."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.settings.health_timeout_s, trust_env=False)
        await self.check_all()
        self._started = True
        self._task = asyncio.create_task(self._loop(), name="agentserve-health")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._client is not None:
            await self._client.aclose()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            await self.check_all()

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(w) for w in self.workers))

    async def check(self, worker: Worker) -> bool:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.settings.health_timeout_s, trust_env=False)
        try:
            resp = await self._client.get(worker.url + "/health")
            ok, why = resp.status_code == 200, f"GET /health returned {resp.status_code}"
        except httpx.HTTPError as exc:
            ok, why = False, f"GET /health failed: {type(exc).__name__} {exc}".strip()
        self._mark(worker, ok, why)
        return ok

    def _mark(self, worker: Worker, ok: bool, why: str) -> None:
        """Record one health check: in after one success (warming when that is after the start:
        slow start), out after ``health_failures`` failures in a row."""
        if ok:
            worker.failures = 0
            if not worker.healthy:
                worker.healthy, worker.last_error = True, None
                worker.healthy_since = time.monotonic() if self._started else float("-inf")
                log.info("worker %s (%s) is healthy", worker.id, worker.url)
        else:
            worker.failures += 1
            worker.last_error = why
            if worker.healthy and worker.failures >= self.settings.health_failures:
                worker.healthy = False
                log.warning("worker %s (%s) taken out: %s", worker.id, worker.url, why)

    def mark_down(self, worker: Worker, reason: str) -> None:
        """Take a worker out now (a request could not connect); health checks bring it back."""
        worker.failures = max(worker.failures, self.settings.health_failures)
        worker.last_error = reason
        if worker.healthy:
            worker.healthy = False
            log.warning("worker %s (%s) taken out: %s", worker.id, worker.url, reason)
