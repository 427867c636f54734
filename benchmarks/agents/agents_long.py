"""The long-session arm of ``agentserve bench agents``: 30+ turns through at least one compaction.

    python benchmarks/agents/agents_long.py capture [--turns 30] [--clients claude,codex] [--out DIR]
    agentserve bench agents --long [--captures DIR] [--servers agentserve,vllm]

``capture`` drives the real client for ``--turns`` user turns of one session (Claude Code:
``claude -p … --continue``; Codex: ``codex exec`` then ``codex exec resume --last``) through
``benchmarks/agents/capture_proxy.py`` against ``agentserve serve`` on the random-weight test model with a
``--window``-token context (32k: Claude Code's own prompt is ~12.4k tokens, Codex's ~9k) and the
``answer_in_text`` state machine (every reply is text: one request a turn, plus the compaction's).
Each turn after the first pastes ``--notes`` lines of build notes (~8 tokens each, different every
turn), so the history passes the client's compaction threshold every few turns. Writes
``OUT/NAME_long.jsonl`` (every request as sent) and ``OUT/NAME_long.live.json`` (per turn: exit
status, whether the client said it compacted).

``--long`` replays each ``*_long.jsonl`` request by request on a fresh server per client and server
(``benchmarks/compare/agents.py``'s replay; ``/v1/responses/compact`` as a plain POST) and writes
``agents_long.{json,md}``: per request the prompt and cached tokens, hit rate, share of the previous
request's prompt read from cache, whether it is a compaction request (``compaction_kind``) or the
first request after one, protocol errors; per client and server a summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

DEFAULT_OUT = Path.home() / ".cache/agentserve/captures"
WINDOW = 32768
STEADY = 0.99  # the claim: a turn reads >= 99 % of the previous prompt from cache (compactions excepted)
ANSWER_IN_TEXT = """\
name: answer_in_text
description: every reply is text (a long session that grows by user turns; a summary is text)
states:
  answer:
    mode: none
default: answer
"""
# How a compaction request reads (checked on the captures of Claude Code 2.1.332 / Codex 0.171.0):
# Claude Code sends the conversation + one user message asking for a summary; Codex (a provider
# that is not OpenAI) sends its summarization prompt as the last user input, or POSTs
# /v1/responses/compact when it compacts remotely.
CLAUDE_MARKERS = ("create a detailed summary of the conversation",)
CODEX_MARKERS = ("CONTEXT CHECKPOINT COMPACTION",)
# Claude Code 2.1.332 resends a turn whose reply had no visible text with this added to the end of
# its last user message: the reusable prompt then stops before that message.
RETRY_MARKERS = ("Your previous response had no visible output",)
COMPACT_PATH = "/v1/responses/compact"
PATHS = ("/v1/messages", "/v1/responses", COMPACT_PATH)


def _texts(content: Any) -> Iterable[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield part["text"]


def _last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message of a Messages or Responses body ('' when none)."""
    items = body.get("messages") if "messages" in body else body.get("input")
    if isinstance(items, str):
        return items
    for item in reversed(items if isinstance(items, list) else []):
        if isinstance(item, dict) and item.get("role") == "user":
            return "\n".join(_texts(item.get("content")))
    return ""


def compaction_kind(request: dict[str, Any]) -> str | None:
    """Why a captured request is a compaction: ``"responses/compact"`` (Codex's remote compaction
    endpoint), ``"summary prompt"`` (the client's own summary request as its last user message), or
    None (a normal turn)."""
    if request.get("path") == COMPACT_PATH:
        return "responses/compact"
    body = request.get("body")
    if not isinstance(body, dict):
        return None
    text = _last_user_text(body).lower()
    if any(m.lower() in text for m in CLAUDE_MARKERS + CODEX_MARKERS):
        return "summary prompt"
    return None


def is_client_retry(request: dict[str, Any]) -> bool:
    """A request the client resent with its last user message edited (not a compaction)."""
    body = request.get("body")
    text = _last_user_text(body) if isinstance(body, dict) else ""
    return compaction_kind(request) is None and any(m in text for m in RETRY_MARKERS)


def load_long(captures: Path) -> dict[str, list[dict[str, Any]]]:
    """The API requests of each ``NAME_long.jsonl`` capture (key NAME), in the order sent."""
    sessions: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(captures.glob("*_long.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        posts = [r for r in rows if r["method"] == "POST" and r["path"] in PATHS]
        if posts:
            sessions[path.stem.removesuffix("_long")] = posts
    return sessions


def annotate(rows: list[dict[str, Any]], requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each replayed row with ``compaction`` (its kind or None), ``after_compaction`` (the first
    normal request after a compaction: its prompt starts over from the summary) and ``client_retry``
    (``is_client_retry``)."""
    out = []
    pending = False
    for row, req in zip(rows, requests, strict=True):
        kind = compaction_kind(req)
        after = kind is None and pending
        retry = is_client_retry(req)
        out.append({**row, "compaction": kind, "after_compaction": after, "client_retry": retry})
        pending = kind is not None
    return out


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "min": min(values), "mean": round(sum(values) / len(values), 4)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One client x server: requests, those answered without a protocol error, compactions, and the
    cache share of the previous prompt over steady turns (neither a compaction, the first request
    after one, a client retry, nor the first request), compaction turns, after-compaction turns and
    client retries."""
    steady = [
        r for r in rows[1:] if not r["compaction"] and not r["after_compaction"] and not r.get("client_retry")
    ]
    shares = [r["of_previous"] for r in steady if r.get("of_previous") is not None]
    return {
        "requests": len(rows),
        "answered": sum(1 for r in rows if not r["errors"]),
        "protocol_errors": sum(len(r["errors"]) for r in rows),
        "compactions": sum(1 for r in rows if r["compaction"]),
        "steady_of_previous": _stats(shares),
        "steady_at_least_99": sum(1 for s in shares if s >= STEADY),
        "steady_unmeasured": len(steady) - len(shares),
        "compaction_hit": _stats([r["hit"] for r in rows if r["compaction"] and r.get("hit") is not None]),
        "after_compaction_hit": _stats(
            [r["hit"] for r in rows if r["after_compaction"] and r.get("hit") is not None]
        ),
        "client_retry_of_previous": _stats(
            [r["of_previous"] for r in rows if r.get("client_retry") and r.get("of_previous") is not None]
        ),
    }


# ---- capture: the real clients, many turns ---------------------------------------------------------


def _prompt(turn: int, notes: int) -> str:
    if turn == 0:
        return "Say hi."
    lines = " ".join(f"note {turn}.{i}: the build step {i} of part {turn} passed." for i in range(notes))
    return f"My notes, part {turn}:\n{lines}\nSay OK."


def _claude_turn(root: Path, url: str, work: Path, turn: int, notes: int, window: int) -> dict[str, Any]:
    from tests.dialects.agent_server import CLAUDE, claude_env

    cmd = [str(CLAUDE), "-p", _prompt(turn, notes), "--output-format", "stream-json", "--verbose"]
    cmd += ["--continue"] if turn else []
    run = subprocess.run(
        cmd,
        cwd=work,
        env=claude_env(root, url, window=window),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    result: dict[str, Any] = next((e for e in events if e.get("type") == "result"), {})
    compacted = [e for e in events if e.get("type") == "system" and e.get("subtype") == "compact_boundary"]
    return {
        "rc": run.returncode,
        "ok": run.returncode == 0 and result.get("subtype") == "success",
        "client_compactions": len(compacted),
        "tail": "" if run.returncode == 0 else run.stderr[-500:] + run.stdout[-500:],
    }


def _codex_turn(root: Path, url: str, work: Path, turn: int, notes: int, window: int) -> dict[str, Any]:
    import os

    from tests.dialects.agent_server import CODEX, codex_config

    home = root / "codex_home"
    if turn == 0:
        home.mkdir()
        (home / "config.toml").write_text(codex_config(url))
    env = {**os.environ, "HOME": str(root), "CODEX_HOME": str(home), "AGENTSERVE_API_KEY": "dummy"}
    cmd = [str(CODEX), "exec", *(["resume", "--last"] if turn else ["-s", "read-only"])]
    cmd += ["--skip-git-repo-check", "--json", _prompt(turn, notes)]
    run = subprocess.run(
        cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900
    )
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    failed = [e for e in events if e.get("type") in ("turn.failed", "error")]
    compacted = [e for e in events if "compact" in json.dumps(e).lower()]
    return {
        "rc": run.returncode,
        "ok": run.returncode == 0 and not failed,
        "client_compactions": len(compacted),
        "tail": "" if run.returncode == 0 and not failed else (run.stderr[-500:] + json.dumps(failed)[-500:]),
    }


TURNS = {"claude": _claude_turn, "codex": _codex_turn}


def capture_long(out: Path, clients: list[str], turns: int, notes: int, window: int) -> None:
    from benchmarks.agents.agent_capture import proxy
    from tests.dialects.agent_server import CLAUDE, CODEX, agent_server, make_agent_model, workdir

    binaries = {"claude": CLAUDE, "codex": CODEX}
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agents-long-") as tmp:
        machine = Path(tmp) / "answer_in_text.yaml"
        machine.write_text(ANSWER_IN_TEXT)
        model = make_agent_model(Path(tmp) / "model", window=window)
        for name in clients:
            if not binaries[name].exists():
                print(f"{name}: not installed at {binaries[name]}: skipped")
                continue
            path = out / f"{name}_long.jsonl"
            path.unlink(missing_ok=True)
            root = Path(tmp) / name
            root.mkdir()
            live: list[dict[str, Any]] = []
            with agent_server(root, model, state_machine=str(machine)) as (url, _), proxy(url, path) as via:
                work = workdir(root)
                for turn in range(turns):
                    start = time.monotonic()
                    row = {"turn": turn + 1, **TURNS[name](root, via, work, turn, notes, window)}
                    row["seconds"] = round(time.monotonic() - start, 1)
                    live.append(row)
                    print(name, json.dumps(row), flush=True)
            requests = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            posts = [r for r in requests if r["method"] == "POST" and r["path"] in PATHS]
            summary = {
                "client": name,
                "turns": turns,
                "turns_completed": sum(1 for r in live if r["ok"]),
                "client_compactions": sum(r["client_compactions"] for r in live),
                "compaction_requests": sum(1 for r in posts if compaction_kind(r)),
                "requests": len(posts),
                "non_200": [
                    (i + 1, r["path"], r["status"]) for i, r in enumerate(posts) if r["status"] != 200
                ],
                "window": window,
                "notes_per_turn": notes,
                "per_turn": live,
            }
            (out / f"{name}_long.live.json").write_text(json.dumps(summary, indent=1) + "\n")
            print(json.dumps({k: v for k, v in summary.items() if k != "per_turn"}), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    cap = sub.add_parser("capture", help="drive the real clients for a long session and record it")
    cap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    cap.add_argument("--clients", default="claude,codex")
    cap.add_argument("--turns", type=int, default=30)
    cap.add_argument("--notes", type=int, default=200, help="note lines pasted per turn (~8 tokens each)")
    cap.add_argument("--window", type=int, default=WINDOW)
    args = ap.parse_args(argv)
    capture_long(args.out, [c for c in args.clients.split(",") if c], args.turns, args.notes, args.window)


if __name__ == "__main__":
    main()
