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
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx

from server.ports import free_port, wait_for_health


def wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    wait_for_health(url, timeout_s, proc)


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
