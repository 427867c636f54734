"""One helper for local servers: a free loopback port, and waiting for GET /health.

Used by the test fixtures and the benchmarks (``server/routing/cluster.py`` and
``tests/routing/conftest.py`` still carry their own copies: they belong to the router).
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Container

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind to 0, read it back, close)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_health(
    url: str,
    timeout_s: float,
    proc: subprocess.Popen | None = None,  # type: ignore[type-arg]
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
        try:
            if httpx.get(url + "/health", timeout=2).status_code in ok:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise TimeoutError(f"{url} did not answer GET /health within {timeout_s:.0f} s")
