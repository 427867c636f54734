"""The real Codex CLI (0.171.0) over the Responses WebSocket, interrupted mid-stream: the engine is idle
within a second and the server log says why.

Codex is driven through ``codex app-server`` (JSON-RPC over stdio: ``thread/start``, ``turn/start``,
``turn/interrupt``: what its IDE clients send on Esc), with ``supports_websockets = true`` and the
``interrupt_on_cancel`` feature on. Seen with 0.171.0 here: on ``turn/interrupt`` Codex closes its
socket mid-stream rather than sending ``response.interrupt``; either way the engine request must end
at once (``response.interrupt`` itself, with its acknowledgement, is tested with a scripted client in
tests/dialects/test_responses_ws_interrupt.py). The model is the random-weight agent test model made
to (almost) never end a text reply, so the turn is still streaming when the interrupt comes.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.dialects.agent_server import CODEX, ROOT, agent_server, codex_config, ends_early, workdir

pytestmark = pytest.mark.slow
VERSION = "0.171.0"


class AppServer:
    """``codex app-server`` over stdio, one JSON message per line."""

    def __init__(self, root: Path, url: str) -> None:
        home = root / "codex_home"
        home.mkdir()
        (home / "config.toml").write_text(codex_config(url, websockets=True) + "interrupt_on_cancel = true\n")
        env = {**os.environ, "HOME": str(root), "CODEX_HOME": str(home), "AGENTSERVE_API_KEY": "dummy"}
        self.work = workdir(root)
        self.proc = subprocess.Popen(
            [str(CODEX), "app-server"],
            cwd=self.work,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.next_id = 0

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.inbox.put(json.loads(line))

    def notify(self, method: str, **params: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"method": method, **({"params": params} if params else {})}) + "\n")
        self.proc.stdin.flush()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"method": method, "id": self.next_id, "params": params}) + "\n")
        self.proc.stdin.flush()
        return self.until(lambda m: m.get("id") == self.next_id)["result"]  # type: ignore[no-any-return]

    def until(self, match: Any, timeout_s: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            message = self.inbox.get(timeout=max(0.01, deadline - time.monotonic()))
            assert "error" not in message, message
            if match(message):
                return message


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    if not CODEX.exists():
        pytest.skip(f"Codex CLI is not installed at {CODEX}: run scripts/install_agent_clients.sh")
    folder = tmp_path_factory.mktemp("codex-interrupt")
    model = folder / "model"
    make = [sys.executable, "-m", "server.cli", "make-test-model", "--family", "hermes", "--hidden", "64"]
    subprocess.run([*make, "--max-positions", "32768", str(model)], check=True, cwd=ROOT, capture_output=True)
    ends_early(model, p_end=0.01, p_eos=1e-9)  # text replies run on until interrupted
    with agent_server(folder, model) as served:
        yield served


def running(url: str) -> float:
    metrics = httpx.get(url + "/metrics", timeout=10).text
    return float(
        next(
            line for line in metrics.splitlines() if line.startswith("agentserve_requests_running ")
        ).split()[1]
    )


def test_codex_interrupts_a_streaming_turn_and_the_engine_is_idle_within_a_second(server, tmp_path):
    url, log = server
    version = subprocess.run([str(CODEX), "--version"], capture_output=True, text=True, timeout=60).stdout
    assert version.split()[-1] == VERSION, version
    seen = len(log.read_text().splitlines())
    codex = AppServer(tmp_path, url)
    try:
        codex.call("initialize", clientInfo={"name": "agentserve-test", "version": "0"})
        codex.notify("initialized")
        thread = codex.call("thread/start", cwd=str(codex.work), sandbox="read-only", approvalPolicy="never")
        tid = thread["thread"]["id"]
        turn = codex.call("turn/start", threadId=tid, input=[{"type": "text", "text": "Read the file a.py."}])
        codex.until(lambda m: m.get("method") == "item/agentMessage/delta")  # the answer streams
        time.sleep(0.5)
        assert running(url) == 1
        sent = time.monotonic()
        codex.call("turn/interrupt", threadId=tid, turnId=turn["turn"]["id"])
        done = codex.until(lambda m: m.get("method") == "turn/completed")
        assert done["params"]["turn"]["status"] == "interrupted"
        while running(url) != 0:
            assert time.monotonic() - sent < 1.0, "the engine still generates a second after the interrupt"
            time.sleep(0.02)
    finally:
        codex.proc.terminate()
        codex.proc.wait(timeout=30)
    lines = log.read_text().splitlines()[seen:]
    said = [line for line in lines if "server.api.responses_ws" in line and "engine request" in line]
    assert said and ("interrupted by the client" in said[-1] or "client left while" in said[-1]), lines[-20:]
