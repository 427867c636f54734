"""A Codex compaction turn with and without ``cache.keep_removed_tools`` (issue 56), on a real capture.

    python benchmarks/cache/compaction_kept_tools.py [--capture benchmarks/data/agent_captures/codex.jsonl]
        [--out benchmarks/results] [--name compaction_kept_tools]

Takes the last ``/v1/responses`` request of a Codex capture (its 9 tools, its history), serves it
in process on the embedded model, then sends the compaction's shape as Codex does: the same
history plus its summarization prompt, with ``tools: []``, in the same session
(``prompt_cache_key``). Once with the setting on (the server renders the previous tools, masked)
and once off (the tools are rendered as sent: none), each arm with its own session key and its own
history text, so neither reads the other's prompt from cache. Reports per arm the compaction
request's prompt tokens, cached tokens, their share, its wall time, and the cache report's type.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CAPTURE = Path("benchmarks/data/agent_captures/codex.jsonl")
# Codex's summarization prompt begins so (benchmarks/agents/agents_long.py: CODEX_MARKERS)
SUMMARY = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM "
    "that will resume the task."
)


BASE_CHARS = 9000  # the capture's prompt (~9.1k tokens) is over the embedded model's 8k window


def last_request(capture: Path) -> dict[str, Any]:
    """The capture's last Responses request, its first developer message (Codex's base instructions,
    17.7k characters) cut to ``BASE_CHARS`` so that it fits the embedded model's window."""
    bodies = [
        r["body"]
        for r in map(json.loads, capture.read_text().splitlines())
        if r.get("method") == "POST" and r.get("path") == "/v1/responses"
    ]
    body = json.loads(json.dumps(bodies[-1]))
    for part in body["input"][0]["content"]:
        if isinstance(part.get("text"), str):
            part["text"] = part["text"][:BASE_CHARS]
    return dict(body)


def arm(client: Any, body: dict[str, Any], key: str) -> dict[str, Any]:
    tag = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"[{key}]"}]}
    turn = {**body, "input": [tag, *body["input"]], "prompt_cache_key": key, "stream": False}
    turn |= {"max_output_tokens": 4, "temperature": 0, "store": False}
    t0 = time.perf_counter()
    first = client.post("/v1/responses", json=turn).json()
    if "cache" not in first:
        raise SystemExit(f"the turn failed: {json.dumps(first)[:2000]}")
    t1 = time.perf_counter()
    ask = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": SUMMARY}]}
    compact = {**turn, "input": [*turn["input"], ask], "tools": [], "tool_choice": "auto"}
    t2 = time.perf_counter()
    out = client.post("/v1/responses", json=compact).json()
    t3 = time.perf_counter()
    c = out["cache"]
    return {
        "turn_prompt_tokens": first["cache"]["prompt_tokens"],
        "turn_seconds": round(t1 - t0, 2),
        "compaction_prompt_tokens": c["prompt_tokens"],
        "compaction_cached_tokens": c["cached_tokens"],
        "compaction_cached_share": round(c["cached_tokens"] / c["prompt_tokens"], 4),
        "compaction_seconds": round(t3 - t2, 2),
        "kept_tools": c.get("kept_tools"),
        "type": c["type"],
        "tool_state": out.get("tool_state"),
        "calls": sum(1 for item in out["output"] if item["type"] in ("function_call", "custom_tool_call")),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capture", type=Path, default=CAPTURE)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--name", default="compaction_kept_tools")
    args = ap.parse_args()
    from fastapi.testclient import TestClient

    from server.app import build_app
    from server.config import load_settings
    from server.engines.hf.engine import HFEngine
    from server.families.model_facts import load_model_facts

    body = last_request(args.capture)
    rows = {}
    base = load_settings(device="cpu")
    engine = HFEngine(base.engine_settings(), load_model_facts(base, "hf"))
    for on in (True, False):
        settings = load_settings(device="cpu", cache={"keep_removed_tools": on})
        with TestClient(build_app(settings, engine=engine)) as client:
            rows["on" if on else "off"] = arm(client, body, f"compaction-{'on' if on else 'off'}")
        print(json.dumps(rows), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "| keep_removed_tools | turn prompt tokens | compaction prompt tokens | cached | cached share | "
        "compaction wall s | kept_tools | report type | tool calls possible |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        mode = (r["tool_state"] or {}).get("mode")
        lines.append(
            f"| {name} | {r['turn_prompt_tokens']} | {r['compaction_prompt_tokens']} | "
            f"{r['compaction_cached_tokens']} | {100 * r['compaction_cached_share']:.1f} % | "
            f"{r['compaction_seconds']} | {len(r['kept_tools'] or [])} | {r['type']} | "
            f"{'no (mode ' + str(mode) + ')' if mode == 'none' else mode} |"
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
