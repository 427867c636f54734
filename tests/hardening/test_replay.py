"""A request that kills workers is not replayed blindly through the fleet: on main the router sent
it to 1 + routing.max_failovers workers, each of which died on it."""

from __future__ import annotations

import time

import httpx
import pytest

from server.config import RoutingSettings, Settings
from server.routing.suspects import SuspectTable
from tests.routing.conftest import RouterThread, spawn_fake_workers, stop_fake_workers

pytestmark = pytest.mark.timeout(120)


def test_the_suspect_table_is_bounded_and_counts_per_body():
    table = SuspectTable(capacity=3)
    assert table.losses(b"a") == 0
    assert table.lost(b"a") == 1 and table.lost(b"a") == 2 and table.losses(b"b") == 0
    for body in (b"b", b"c", b"d"):
        table.lost(body)
    assert table.losses(b"a") == 0 and len(table._losses) == 3


def test_a_request_that_kills_workers_is_replayed_at_most_once_then_refused():
    workers = spawn_fake_workers(3, prefix="k")
    for w in workers:
        w.configure(die_after_chunks=0)  # a streaming request kills the worker that serves it
    settings = Settings(routing=RoutingSettings(health_interval_s=0.2, health_failures=1))
    router = RouterThread(settings, [w.url for w in workers]).start()
    body = {"model": "fake", "messages": [{"role": "user", "content": "poison"}], "stream": True}
    try:
        r = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "request_lost_workers" and "routing.max_worker_losses" in err["message"]
        deadline = time.monotonic() + 5
        while sum(w.proc.poll() is not None for w in workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a third death would show by now
        dead = [w for w in workers if w.proc.poll() is not None]
        alive = [w for w in workers if w.proc.poll() is None]
        assert len(dead) == 2 and len(alive) == 1  # one replay, then no more
        again = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=30)
        assert again.status_code == 503 and again.json()["error"]["code"] == "request_lost_workers"
        assert alive[0].proc.poll() is None and alive[0].log() == []  # never sent to the last one
        normal = {"model": "fake", "messages": [{"role": "user", "content": "hello"}]}
        ok = httpx.post(router.url + "/v1/chat/completions", json=normal, timeout=5)
        assert ok.status_code == 200 and ok.headers["x-agentserve-worker"] == alive[0].url
    finally:
        router.stop()
        stop_fake_workers(workers)
