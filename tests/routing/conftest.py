"""Router test harness: fake worker processes (killable) and routers in threads, loopback only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import pytest
import uvicorn

from server.config import RoutingSettings, Settings
from server.ports import free_port, listening_socket, wait_for_health
from server.routing.router_app import create_router_app

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class FakeWorker:
    id: str
    url: str
    proc: subprocess.Popen

    def configure(self, **cfg: object) -> None:
        httpx.post(self.url + "/fake/config", json=cfg, timeout=5).raise_for_status()

    def log(self) -> list[dict]:
        return httpx.get(self.url + "/fake/log", timeout=5).json()

    def reset(self) -> None:
        httpx.post(self.url + "/fake/reset", timeout=5).raise_for_status()
        self.configure(
            delay_s=0.0, chunks=3, chunk_delay_s=0.0, die_after_chunks=None, healthy=True, ws_close_after=None
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


def spawn_fake_workers(
    n: int, prefix: str = "w", socks: list[socket.socket] | None = None, **kw: object
) -> list[FakeWorker]:
    socks = socks or [listening_socket() for _ in range(n)]
    workers = []
    for i, sock in enumerate(socks):
        argv = [
            sys.executable,
            "-m",
            "server.routing.fake_worker",
            "--id",
            f"{prefix}{i}",
            "--fd",
            str(sock.fileno()),
        ]
        argv += [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
        proc = subprocess.Popen(argv, pass_fds=[sock.fileno()], cwd=ROOT)
        host, port = sock.getsockname()[:2]
        workers.append(FakeWorker(f"{prefix}{i}", f"http://{host}:{port}", proc))
        sock.close()  # the child owns it now: when the child dies, connections are refused
    try:
        for w in workers:
            wait_for_health(w.url, 20, proc=w.proc, poll_s=0.05)
    except BaseException:
        stop_fake_workers(workers)
        raise
    return workers


def stop_fake_workers(workers: list[FakeWorker]) -> None:
    for w in workers:
        if w.proc.poll() is None:
            w.proc.terminate()
    for w in workers:
        try:
            w.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait(timeout=5)


def test_settings(**routing: object) -> Settings:
    base: dict[str, object] = dict(
        health_interval_s=0.2,
        health_timeout_s=1.0,
        health_failures=1,
        connect_timeout_s=1.0,
        read_timeout_s=10.0,
        load_floor=1,
    )
    base.update(routing)
    return Settings(routing=RoutingSettings(**base))


@dataclass
class RouterThread:
    """A router app served by uvicorn in a background thread (its own event loop)."""

    settings: Settings
    workers: list[str]
    url: str = ""
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None
    app: object = field(default=None)
    discovery: object = None

    def start(self) -> RouterThread:
        self.app = create_router_app(self.settings, self.workers, self.discovery)
        sock = listening_socket()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30  # bounds the wait only
        while not self.server.started:
            assert time.monotonic() < deadline, "router did not start"
            time.sleep(0.02)
        return self

    @property
    def router(self):
        return self.app.state.router

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
            self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def fake_workers() -> Iterator[list[FakeWorker]]:
    workers = spawn_fake_workers(3)
    yield workers
    stop_fake_workers(workers)


@pytest.fixture
def workers(fake_workers: list[FakeWorker]) -> list[FakeWorker]:
    """The module's three workers, reset (log, cache, config) for this test."""
    for w in fake_workers:
        w.reset()
    return fake_workers


@pytest.fixture
def make_router() -> Iterator:
    started: list[RouterThread] = []

    def make(worker_urls: list[str], **routing: object) -> RouterThread:
        r = RouterThread(test_settings(**routing), worker_urls).start()
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()


@contextmanager
def real_cluster(workers: int, health_interval_s: float, start_timeout_s: float = 240) -> Iterator[tuple]:
    """`agentserve serve --workers N` on the embedded model; yields (url, process); stops it with SIGTERM."""
    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "AGENTSERVE_ROUTING__HEALTH_INTERVAL_S": str(health_interval_s),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "serve", "--workers", str(workers), "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, start_timeout_s, proc=proc, poll_s=0.05)
        yield url, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
