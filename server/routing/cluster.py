"""``agentserve serve --workers N``: N worker processes behind one router on the public port.

Each worker is ``agentserve serve --workers 1`` on 127.0.0.1 and a free port, with
the router's own settings (written to a temporary YAML file; flags pin port, host
and workers so AGENTSERVE_* variables cannot make a worker recurse). The router
starts once every worker answers GET /health (progress is printed while models
load; a worker that exits or the ``routing.worker_start_timeout_s`` limit ends
the start with a clear error). On CPU, unless ``threads`` is set, each worker gets
cores // N torch threads. Workers are stopped (SIGTERM, then SIGKILL after
10 s) when the router exits, on SIGINT/SIGTERM too; on Linux they also get
SIGTERM if this process dies without cleaning up.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from server.config import Settings
from server.ports import free_port, health_ok
from server.routing.workers import WorkerSpec

# (index, port, settings YAML path) -> argv of one worker process
WorkerCommand = Callable[[int, int, str], list[str]]


class ClusterError(RuntimeError):
    """The workers could not be started; the message says which and why."""


def default_worker_command(index: int, port: int, config_path: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "server.cli",
        "serve",
        "--config",
        config_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]


@dataclass
class WorkerProcess:
    spec: WorkerSpec
    proc: subprocess.Popen[bytes]


def _die_with_parent() -> None:  # runs in the child before exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn_workers(n: int, config_path: str, command: WorkerCommand) -> list[WorkerProcess]:
    workers = []
    try:
        for i in range(n):
            port = free_port()
            proc = subprocess.Popen(
                command(i, port, config_path),
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
            workers.append(WorkerProcess(WorkerSpec(f"w{i}", f"http://127.0.0.1:{port}"), proc))
            print(f"agentserve: worker w{i} pid {proc.pid} on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    except BaseException:
        stop_workers(workers)
        raise
    return workers


def wait_ready(workers: list[WorkerProcess], timeout_s: float, poll_s: float = 0.5) -> float:
    """Block until every worker answers GET /health with 200; returns seconds waited."""
    t0 = time.monotonic()
    ready: set[str] = set()
    last_report = 0.0
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while True:
            for w in workers:
                if w.spec.id in ready:
                    continue
                code = w.proc.poll()
                if code is not None:
                    raise ClusterError(
                        f"worker {w.spec.id} (pid {w.proc.pid}) exited with code {code} "
                        "before it was ready; its log is above"
                    )
                if health_ok(w.spec.url, client=client):
                    ready.add(w.spec.id)
            elapsed = time.monotonic() - t0
            if len(ready) == len(workers):
                return elapsed
            if elapsed > timeout_s:
                waiting = ", ".join(w.spec.id for w in workers if w.spec.id not in ready)
                raise ClusterError(
                    f"workers not ready after {timeout_s:.0f}s ({waiting}); raise "
                    "routing.worker_start_timeout_s if the model takes longer to load"
                )
            if elapsed - last_report >= 5.0:
                last_report = elapsed
                waiting = ", ".join(w.spec.id for w in workers if w.spec.id not in ready)
                print(
                    f"agentserve: {len(ready)}/{len(workers)} workers ready after {elapsed:.0f}s "
                    f"(waiting for {waiting})",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(poll_s)


def stop_workers(workers: list[WorkerProcess], grace_s: float = 10.0) -> None:
    for w in workers:
        if w.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                w.proc.terminate()
    deadline = time.monotonic() + grace_s
    for w in workers:
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait(timeout=5)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM unwinds like SIGINT (so the workers are stopped) instead of killing us."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def worker_settings_file(settings: Settings, directory: str) -> str:
    """The router's settings for one worker; unless ``threads`` is set, the CPU cores are
    shared out (N workers that each take every core would thrash)."""
    data = settings.model_dump(mode="json")
    data.update(workers=1, host="127.0.0.1")
    if settings.threads is None and settings.device != "cuda":
        data["threads"] = max(1, (os.cpu_count() or 1) // settings.workers)
    path = Path(directory) / "worker.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=True))
    return str(path)


def serve_cluster(settings: Settings, command: WorkerCommand | None = None) -> None:
    """Start ``settings.workers`` workers, then the router on settings.host:port until it exits."""
    from server.routing.router_app import serve_router

    n = settings.workers
    if settings.auth.api_keys and not settings.auth.router_token:
        # the router tells its own workers the tenant it authenticated (a fresh secret per start)
        auth = settings.auth.model_copy(update={"router_token": secrets.token_hex(32)})
        settings = settings.model_copy(update={"auth": auth})
    with tempfile.TemporaryDirectory(prefix="agentserve-cluster-") as tmp:
        config_path = worker_settings_file(settings, tmp)
        workers: list[WorkerProcess] = []
        try:
            # uvicorn re-raises the SIGTERM it handled once it has shut down: with this handler
            # that unwinds here (workers stopped) instead of killing the process
            with _sigterm_raises():
                print(f"agentserve: starting {n} workers", file=sys.stderr, flush=True)
                workers = spawn_workers(n, config_path, command or default_worker_command)
                took = wait_ready(workers, settings.routing.worker_start_timeout_s)
                print(
                    f"agentserve: {n} workers ready in {took:.1f}s; router on "
                    f"http://{settings.host}:{settings.port}",
                    file=sys.stderr,
                    flush=True,
                )
                serve_router(settings, [w.spec for w in workers])
        except KeyboardInterrupt:
            pass
        finally:
            stop_workers(workers)
            print("agentserve: workers stopped", file=sys.stderr, flush=True)
