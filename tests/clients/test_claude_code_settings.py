"""Claude Code (npm ``@anthropic-ai/claude-code@2.1.332``) with ``configs/clients/claude-code/settings.json``
exactly as shipped (its ``env`` block; only ``ANTHROPIC_BASE_URL`` pointed at the test server, and a
fresh ``HOME``), on the window the file is written for: 65,536 tokens (docs: README, configs/clients).

The file tells Claude Code 3/4 of the served window (``CLAUDE_CODE_MAX_CONTEXT_TOKENS`` 49152), so its
auto-compaction (at told window − ``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` − 13,000 by its own count) sends the
summary request with room to spare. Issue 52: told the whole 64k, the summary request arrived at 57–63k
of the window and the first compaction attempt failed ("The model has reached its context window
limit"). A ``claude -p … --continue`` session grows by ~8k tokens of notes a turn until Claude Code
compacts; pass: every turn exits 0, its first compaction succeeds, the turn after it too, and the
server answered no 4xx or 5xx. The model: the ends-early random-weight test model (the embedded 8k
model cannot hold Claude Code's ~12k-token prompt).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.dialects.agent_server import (
    CLAUDE,
    CLAUDE_SETTINGS,
    agent_server,
    make_agent_model,
    served_statuses,
)

WINDOW = 65536  # the served window settings.json is written for
ANSWER_IN_TEXT = """\
name: answer_in_text
description: every reply is text (a session that grows by user turns; Claude Code's summary is text)
states:
  answer:
    mode: none
default: answer
"""


def shipped_env(home: Path, url: str) -> dict[str, str]:
    """The process environment with settings.json's ``env`` block as shipped; the base URL and HOME only."""
    env = json.loads(CLAUDE_SETTINGS.read_text())["env"]
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8000", CLAUDE_SETTINGS
    return {**os.environ, **env, "ANTHROPIC_BASE_URL": url, "HOME": str(home)}


def test_the_shipped_window_is_three_quarters_of_the_served_one():
    env = json.loads(CLAUDE_SETTINGS.read_text())["env"]
    assert int(env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"]) == WINDOW * 3 // 4
    # its compaction threshold (told window - output - 13,000): room above Claude Code's ~12.4k prompt
    assert (
        int(env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"]) - int(env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) - 13000 > 20000
    )


def _compaction(event: dict) -> str | None:
    """ "ok" / "failed" for a stream-json event reporting a compaction, else None."""
    if event.get("type") != "system":
        return None
    if event.get("subtype") == "compact_boundary":
        return "ok"
    if "compact_result" in event:
        return "failed" if event["compact_result"] == "failed" else "ok"
    return None


@pytest.mark.slow
@pytest.mark.clients
@pytest.mark.timeout(3000)
def test_claude_code_as_shipped_compacts_at_the_first_attempt(tmp_path):
    if not CLAUDE.exists():
        pytest.skip(f"Claude Code is not installed at {CLAUDE}: run scripts/install_agent_clients.sh")
    machine = tmp_path / "answer_in_text.yaml"
    machine.write_text(ANSWER_IN_TEXT)
    model = make_agent_model(tmp_path / "model", window=WINDOW)
    notes = " ".join(f"note {i}: the build step {i} passed." for i in range(800))
    work = tmp_path / "work"
    work.mkdir()
    runs: list[dict] = []
    with agent_server(tmp_path, model, state_machine=str(machine)) as (url, log):
        env = shipped_env(tmp_path / "home", url)
        for turn in range(10):
            prompt = "Say hi." if turn == 0 else f"My notes, part {turn}:\n{notes}\nSay OK."
            cmd = [str(CLAUDE), "-p", prompt, "--output-format", "stream-json", "--verbose"]
            cmd += ["--continue"] if turn else []
            start = time.monotonic()
            run = subprocess.run(
                cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900
            )
            events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
            result = next((e for e in events if e.get("type") == "result"), {})
            usage = result.get("usage", {})
            runs.append(
                {
                    "turn": turn,
                    "rc": run.returncode,
                    "seconds": round(time.monotonic() - start, 1),
                    "compactions": [c for c in map(_compaction, events) if c],
                    "result": result.get("subtype"),
                    "input": usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0),
                    "cache_read": usage.get("cache_read_input_tokens"),
                    "stderr": run.stderr[-300:],
                }
            )
            print(json.dumps(runs[-1]), flush=True)
            done = [r["turn"] for r in runs if r["compactions"]]
            if run.returncode != 0 or (done and turn > done[0]):  # one more turn after the compaction
                break
        served = served_statuses(log.read_text().splitlines())
    detail = json.dumps(runs, indent=1)
    assert all(r["rc"] == 0 and r["result"] == "success" for r in runs), detail
    compacted = [r for r in runs if r["compactions"]]
    assert compacted, detail  # the session outgrew the told window and Claude Code compacted
    assert compacted[0]["compactions"][0] == "ok", detail  # at the first attempt
    assert runs[-1]["turn"] > compacted[0]["turn"], detail  # and the session went on
    refused = [line for line in served if '" 4' in line or '" 5' in line]
    assert not refused, refused  # told the window: never a window 400 (nor anything else)
