"""The real Codex CLI (npm ``@openai/codex@0.169.0``), unchanged, against ``agentserve serve``.

``codex exec`` sends its real ~9k-token prompt (two ``developer`` messages, the environment context),
its tools (function tools, the ``multi_agent_v1`` namespace tool, the hosted ``web_search`` tool) and
``reasoning`` / ``include`` / ``prompt_cache_key`` to ``POST /v1/responses`` (streaming, ``store: false``),
through a provider declared in a fresh ``$CODEX_HOME/config.toml``. The server runs a random-weight
long-context test model and the tool state machine ``grammars/read_then_answer.yaml``: the masks make
turn 1 one call of the read-only ``view_image`` tool (a random path: "unable to locate image ..."), and
turn 2 (after the tool output) text. Pass: exit 0, the tool ran and its output went back (Codex's own
session record), the final answer printed, turn 2 read >= 99 % of turn 1's prompt from the prefix
cache, no 4xx/5xx in the server log. Install the client with ``scripts/install_agent_clients.sh``.

Twice: over HTTP streaming, and over the Responses WebSocket (``supports_websockets = true``: Codex
warms the socket up with ``generate: false``, then sends each turn as ``previous_response_id`` + only
its new items). The WebSocket run needs uvicorn's WebSocket support (the ``websockets`` package).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.dialects.agent_server import CODEX, agent_server, run_codex, served_statuses

pytestmark = pytest.mark.slow
VERSION = "0.169.0"


def session_items(codex_home: Path) -> list[dict[str, Any]]:
    """The response items of Codex's rollout file for the run: what it sent and received, in order."""
    (rollout,) = sorted(codex_home.glob("sessions/**/rollout-*.jsonl"))
    rows = [json.loads(line) for line in rollout.read_text().splitlines() if line.strip()]
    return [r["payload"] for r in rows if r.get("type") == "response_item"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not CODEX.exists():
        pytest.skip(f"Codex CLI is not installed at {CODEX}: run scripts/install_agent_clients.sh")
    with agent_server(tmp_path_factory.mktemp("codex")) as (url, log):
        yield url, log


@pytest.mark.parametrize("transport", ["http", "websocket"])
def test_codex_exec_runs_a_tool_and_answers_with_turn_two_from_cache(server, tmp_path, transport):
    url, log = server
    websockets = transport == "websocket"
    if websockets and not any(importlib.util.find_spec(m) for m in ("websockets", "wsproto")):
        pytest.skip("uvicorn has no WebSocket support here: install the 'websockets' package")
    seen = len(log.read_text().splitlines())
    version = subprocess.run([str(CODEX), "--version"], capture_output=True, text=True, timeout=60).stdout
    assert version.split()[-1] == VERSION, version
    run = run_codex(tmp_path, url, websockets)
    home = tmp_path / "codex_home"
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert not [e for e in events if e.get("type") in ("turn.failed", "error")], events
    items = session_items(home)
    calls = [i for i in items if i["type"] == "function_call"]
    outputs = [i for i in items if i["type"] == "function_call_output"]
    assert [c["name"] for c in calls] == ["view_image"]
    assert [o["call_id"] for o in outputs] == [calls[0]["call_id"]]  # the tool ran; its output went back
    assert outputs[0]["output"]  # what view_image said of the random path ("unable to locate image at ...")
    answers = [i for i in items if i["type"] == "message" and i["role"] == "assistant"]
    assert items.index(answers[-1]) > items.index(outputs[0])
    final = [e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"]
    assert final and final[-1] == answers[-1]["content"][0]["text"]  # the final answer was printed
    (usage,) = [e["usage"] for e in events if e.get("type") == "turn.completed"]
    # the usage is summed over both requests; turn 2's prompt holds turn 1's, so turn 1 <= half the sum
    assert usage["input_tokens"] > 2000
    assert usage["cached_input_tokens"] >= 0.99 * usage["input_tokens"] / 2, usage
    lines = log.read_text().splitlines()[seen:]
    served = served_statuses(lines)
    posts = [line for line in served if "POST /v1/responses" in line]
    sockets = [line for line in lines if '"WebSocket /v1/responses" [accepted]' in line]
    if websockets:
        assert len(sockets) == 1 and not posts, lines  # one socket for the run, no fallback to HTTP
    else:
        assert len(posts) == 2 and not sockets, lines
    assert all('" 200' in line for line in served), served
