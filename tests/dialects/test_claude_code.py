"""The real Claude Code (npm ``@anthropic-ai/claude-code@2.1.332``), unchanged, against ``agentserve serve``.

``claude -p`` sends its real 13k-token system prompt, 14 tools and ``thinking``/``output_config``/
``context_management`` fields to ``/v1/messages?beta=true`` (streaming). The server runs a random-weight
long-context test model and the tool state machine ``grammars/read_then_answer.yaml``: the masks make
turn 1 one call of the read-only ``Read`` tool, and turn 2 (after the tool result) text. Pass: exit 0,
the tool ran and its result went back, turn 2 read >= 99 % of turn 1's prompt from the prefix cache,
no 4xx/5xx in the server log. Install the client with ``scripts/install_agent_clients.sh``.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.dialects.agent_server import CLAUDE, agent_server, run_claude, served_statuses

pytestmark = pytest.mark.slow
VERSION = "2.1.332"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not CLAUDE.exists():
        pytest.skip(f"Claude Code is not installed at {CLAUDE}: run scripts/install_agent_clients.sh")
    with agent_server(tmp_path_factory.mktemp("cc")) as (url, log):
        yield url, log


def test_claude_code_runs_a_tool_and_answers_with_turn_two_from_cache(server, tmp_path):
    url, log = server
    version = subprocess.run([str(CLAUDE), "--version"], capture_output=True, text=True, timeout=60).stdout
    if not os.environ.get("AGENTSERVE_DRIFT_LOG"):  # scripts/client_drift.sh runs the newest one
        assert version.startswith(VERSION), version
    run = run_claude(tmp_path, url)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    turns = [e["message"] for e in events if e.get("type") == "assistant"]
    calls = [b for b in turns[0]["content"] if b["type"] == "tool_use"]
    assert [c["name"] for c in calls] == ["Read"]
    results = [
        b
        for e in events
        if e.get("type") == "user"
        for b in e["message"]["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert [r["tool_use_id"] for r in results] == [calls[0]["id"]]  # the tool ran; its result went back
    assert [b["type"] for b in turns[-1]["content"]] == ["text"]
    result = next(e for e in events if e.get("type") == "result")
    assert result["subtype"] == "success" and result["num_turns"] == 2
    # message_start reports a turn's whole prompt as input_tokens; the totals are the final usages
    prompt1 = turns[0]["usage"]["input_tokens"]
    assert result["usage"]["cache_read_input_tokens"] >= 0.99 * prompt1, (result["usage"], prompt1)
    served = served_statuses(log.read_text().splitlines())
    assert served and all('" 200' in line for line in served), served
