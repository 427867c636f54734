"""One helper for local servers: a free loopback port, and waiting for GET /health.

Used by the cluster launcher (``server/routing/cluster.py``), the test fixtures and the
benchmarks.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Container
from typing import Any

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind to 0, read it back, close)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def listening_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A bound, listening socket on a free (or the given) port, to hand to a child process by fd."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def health_ok(url: str, ok: Container[int] = (200,), client: httpx.Client | None = None) -> bool:
    """One probe: does ``GET url/health`` answer a status in ``ok``? (False if it does not answer.)"""
    try:
        if client is not None:
            return client.get(url + "/health").status_code in ok
        return httpx.get(url + "/health", timeout=2, trust_env=False).status_code in ok
    except httpx.HTTPError:
        return False


def wait_for_health(
    url: str,
    timeout_s: float,
    proc: subprocess.Popen[Any] | None = None,
    ok: Container[int] = (200,),
    poll_s: float = 0.2,
) -> float:
    """Block until ``GET url/health`` answers a status in ``ok``; returns the seconds waited.

    Raises RuntimeError when ``proc`` exits first, TimeoutError after ``timeout_s``.
    """
    start = time.monotonic()
    deadline = start + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"{url}: the server process exited with code {proc.returncode} before it was healthy"
            )
        if health_ok(url, ok):
            return time.monotonic() - start
        time.sleep(poll_s)
    raise TimeoutError(f"{url} did not answer GET /health within {timeout_s:.0f} s")
