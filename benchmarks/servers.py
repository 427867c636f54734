"""Servers to benchmark: a running one (URL), one in-process (loopback port), or N workers + router.

``local_server(**overrides)`` builds the worker app exactly as ``agentserve serve`` does
(``build_app(load_settings(**overrides))``) and runs it with uvicorn on a free
127.0.0.1 port in a thread; leaving the context stops it and frees the engine.
``cluster_server(workers, policy)`` starts ``agentserve serve --workers N`` as a
subprocess (the routing branch's router + worker processes) with the policy set
through ``AGENTSERVE_ROUTING__POLICY``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server process exited with code {proc.returncode} before it was healthy")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} did not answer GET /health within {timeout_s:.0f} s")


def server_info(url: str) -> dict[str, Any]:
    """Model name and context window from GET /v1/models."""
    data = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]
    return {"model": data["id"], "max_model_len": data.get("max_model_len"), "engine": data.get("engine")}


@contextlib.contextmanager
def local_server(config_file: str | None = None, **overrides: Any) -> Iterator[str]:
    import uvicorn

    from server.app import build_app
    from server.config import load_settings

    port = free_port()
    app = build_app(load_settings(config_file, **overrides))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True, name="bench-server")
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 600)
        yield url
    finally:
        server.should_exit = True
        thread.join(60)


def routing_available() -> bool:
    return (
        importlib.util.find_spec("server.routing") is not None
        and importlib.util.find_spec("server.routing.cluster") is not None
    )


@contextlib.contextmanager
def cluster_server(workers: int, policy: str, extra_env: dict[str, str] | None = None) -> Iterator[str]:
    if not routing_available():
        raise RuntimeError(
            "server.routing is not installed on this branch yet: the routing comparison needs "
            "the routing branch merged (agentserve serve --workers N)"
        )
    port = free_port()
    env = {**os.environ, "AGENTSERVE_ROUTING__POLICY": policy, **(extra_env or {})}
    cmd = [
        sys.executable,
        "-m",
        "server.cli",
        "serve",
        "--workers",
        str(workers),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
    ]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 900, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
