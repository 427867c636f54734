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

from tests.dialects.agent_server import (
    CLAUDE,
    agent_server,
    claude_env,
    make_agent_model,
    run_claude,
    served_statuses,
    workdir,
)

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
        if not os.environ.get("AGENTSERVE_DRIFT_LOG"):  # scripts/client_drift.sh runs newer versions
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


ANSWER_IN_TEXT = """\
name: answer_in_text
description: every reply is text (a session that grows by user turns; Claude Code's summary is text)
states:
  answer:
    mode: none
default: answer
"""
WINDOW = 32768  # Claude Code's own prompt is ~12.4k tokens here; its compaction needs prefix < window - 13.5k


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("told", [True, False], ids=["told-the-window", "reactive"])
def test_claude_code_compacts_a_session_past_the_window_and_goes_on(tmp_path, told):
    """Issue 36: a ``claude -p … --continue`` session on a 32k test model grows by ~6k tokens of notes a
    turn. Told the window (configs/clients/claude-code's ``CLAUDE_CODE_MAX_CONTEXT_TOKENS``), Claude Code
    compacts before the window is full; not told (it believes 1M), the session passes the window and
    our ``prompt is too long`` 400 makes it compact. Either way the compaction request fits and the turn
    with (or after) it succeeds; no 5xx."""
    if not CLAUDE.exists():
        pytest.skip(f"Claude Code is not installed at {CLAUDE}: run scripts/install_agent_clients.sh")
    machine = tmp_path / "answer_in_text.yaml"
    machine.write_text(ANSWER_IN_TEXT)
    model = make_agent_model(tmp_path / "model", window=WINDOW)
    notes = " ".join(f"note {i}: the build step {i} passed." for i in range(800))
    runs = []
    with agent_server(tmp_path, model, state_machine=str(machine)) as (url, log):
        env = claude_env(tmp_path, url, window=WINDOW)
        if not told:
            del env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"]
        work = workdir(tmp_path)
        for turn in range(8):
            prompt = "Say hi." if turn == 0 else f"My notes, part {turn}:\n{notes}\nSay OK."
            cmd = [str(CLAUDE), "-p", prompt, "--output-format", "stream-json", "--verbose"]
            cmd += ["--continue"] if turn else []
            run = subprocess.run(
                cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900
            )
            events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
            runs.append((run.returncode, events, run.stderr[-1000:]))
            print(
                "turn",
                turn,
                run.returncode,
                [_brief(e) for e in events if e.get("type") == "system"][1:],
                flush=True,
            )
            done = [i for i, (_, evs, _) in enumerate(runs) if any(_compacted(e) for e in evs)]
            if done and len(runs) > done[0] + 1:  # one more turn after the compaction
                break
        lines = log.read_text().splitlines()
    summary = [(rc, [_brief(e) for e in evs if e.get("type") in ("system", "result")]) for rc, evs, _ in runs]
    compacted = [i for i, (_, events, _) in enumerate(runs) if any(_compacted(e) for e in events)]
    assert compacted, summary
    after = compacted[0] + (0 if runs[compacted[0]][0] == 0 else 1)
    assert after < len(runs) and runs[after][0] == 0, summary  # the turn with (or after) the compaction works
    result = next(e for e in runs[after][1] if e.get("type") == "result")
    assert result["subtype"] == "success", summary
    served = served_statuses(lines)
    assert not [line for line in served if '" 5' in line], served  # no 5xx, ever
    refused = [line for line in served if '" 400' in line]
    assert told or refused, served  # not told: it passed the window, and our 400 made it compact
    print(summary, len(refused), "window 400s")


def _compacted(event: dict) -> bool:
    """A stream-json event saying Claude Code compacted the conversation (and it did not fail)."""
    if event.get("type") != "system":
        return False
    return event.get("subtype") == "compact_boundary" or (
        "compact_result" in event and event.get("compact_result") != "failed"
    )


def _brief(event: dict) -> str:
    keys = ("subtype", "status", "compact_result", "compact_error", "is_error", "num_turns")
    return json.dumps({k: event[k] for k in keys if k in event})
