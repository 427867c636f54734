"""Workers from DNS (`route --workers-dns NAME:PORT`): a stub resolver stands in for the DNS server."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from server.config import RoutingSettings, Settings
from server.routing.discovery import DnsDiscovery, worker_specs
from server.routing.workers import WorkerPool
from tests.routing.conftest import RouterThread, listening_socket, spawn_fake_workers, stop_fake_workers

pytestmark = pytest.mark.timeout(60)


class StubResolver:
    """What the DNS server answers now (a list of addresses, or an OSError to raise)."""

    def __init__(self, answer: list[str]) -> None:
        self.answer: list[str] | OSError = answer
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, name: str, port: int) -> list[str]:
        self.asked.append((name, port))
        if isinstance(self.answer, OSError):
            raise self.answer
        return list(self.answer)


def test_parse_target_and_ids():
    d = DnsDiscovery.parse("workers.default.svc.cluster.local:8000", 5.0)
    assert (d.name, d.port, d.interval_s) == ("workers.default.svc.cluster.local", 8000, 5.0)
    for bad in ("workers", "workers:", ":8000", "workers:http", "workers:70000"):
        with pytest.raises(ValueError, match="expected NAME:PORT"):
            DnsDiscovery.parse(bad, 5.0)
    specs = worker_specs(["10.0.0.2", "10.0.0.1", "10.0.0.2", "fd00::1"], 8000)
    assert [(s.id, s.url) for s in specs] == [
        ("10.0.0.1:8000", "http://10.0.0.1:8000"),
        ("10.0.0.2:8000", "http://10.0.0.2:8000"),
        ("[fd00::1]:8000", "http://[fd00::1]:8000"),
    ]


def test_refresh_adds_and_removes_workers_and_keeps_them_on_a_failed_lookup():
    stub = StubResolver(["10.0.0.1", "10.0.0.2"])
    pool = WorkerPool([], RoutingSettings(health_timeout_s=0.2))
    d = DnsDiscovery("workers", 9, 1.0, stub)

    async def run() -> None:
        assert await d.refresh(pool)
        assert [w.id for w in pool.workers] == ["10.0.0.1:9", "10.0.0.2:9"]
        kept = pool.workers[1]
        kept.in_flight = 3
        stub.answer = ["10.0.0.2", "10.0.0.3"]
        assert await d.refresh(pool)
        assert [w.id for w in pool.workers] == ["10.0.0.2:9", "10.0.0.3:9"]
        assert pool.workers[0] is kept and kept.in_flight == 3  # a worker that stays keeps its state
        stub.answer = OSError("Name or service not known")
        assert not await d.refresh(pool)
        assert [w.id for w in pool.workers] == ["10.0.0.2:9", "10.0.0.3:9"] and "not known" in d.last_error
        await pool.close()

    asyncio.run(run())
    assert stub.asked[0] == ("workers", 9)


def test_router_follows_dns_as_workers_join_and_leave():
    # three fake workers on one port and three loopback addresses, like pods behind a headless Service
    first = listening_socket("127.0.0.2")
    port = first.getsockname()[1]
    try:
        socks = [first, listening_socket("127.0.0.3", port), listening_socket("127.0.0.4", port)]
    except OSError:
        first.close()
        pytest.skip("cannot bind the port on 127.0.0.3-4")
    workers = spawn_fake_workers(3, prefix="dns", socks=socks)
    stub = StubResolver(["127.0.0.2", "127.0.0.3"])
    settings = Settings(routing=RoutingSettings(health_interval_s=0.2, health_failures=1))
    r = RouterThread(settings, [], discovery=DnsDiscovery("agentserve-workers", port, 0.2, stub)).start()
    try:

        def used(n: int = 40) -> set[str]:
            out = set()
            for s in range(n):
                body = {
                    "model": "fake",
                    "messages": [{"role": "user", "content": "hi"}],
                    "prompt_cache_key": f"dns-{s}",
                }
                resp = httpx.post(r.url + "/v1/chat/completions", json=body, timeout=5)
                assert resp.status_code == 200
                out.add(resp.headers["x-agentserve-worker"])
            return out

        def wait_for(ids: set[str]) -> None:
            deadline = time.monotonic() + 30  # bounds the wait only
            while {
                w["id"] for w in httpx.get(r.url + "/workers", timeout=5).json()["workers"] if w["healthy"]
            } != ids:
                assert time.monotonic() < deadline, httpx.get(r.url + "/workers").json()
                time.sleep(0.05)

        assert used() == {f"127.0.0.2:{port}", f"127.0.0.3:{port}"}
        stub.answer = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]  # scale up
        wait_for({f"127.0.0.{i}:{port}" for i in (2, 3, 4)})
        assert used() == {f"127.0.0.{i}:{port}" for i in (2, 3, 4)}
        stub.answer = ["127.0.0.4"]  # two leave
        wait_for({f"127.0.0.4:{port}"})
        assert used() == {f"127.0.0.4:{port}"}
        assert len(httpx.get(r.url + "/workers", timeout=5).json()["workers"]) == 1
    finally:
        r.stop()
        stop_fake_workers(workers)
