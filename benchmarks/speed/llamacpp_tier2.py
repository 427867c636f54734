"""In process: what the llamacpp engine's tier 2 buys a session that comes back after the pool evicted it.

    python benchmarks/speed/llamacpp_tier2.py [--model embedded|FILE.gguf] [--threads 2] [--ctx 4096]
        [--sessions 4] [--length 1500] [--turns 3] [--tier2-mb 1024] [--repeat 1] [--policy lru|session]
        [--out PATH]

``--sessions`` agent sessions of ``--length``-token prompts take turns round robin (each turn:
the previous prompt + the 8-token greedy reply + a new user line), more than a pool of ``--ctx``
cells holds, so each session's KV is evicted before it is back (``--policy lru``, the default:
round robin is LRU's worst case, each turn evicts the session that comes next). Two arms on the
same engine settings and token ids, alternating (off, on, off, ...): ``prefix_cache.tier2.memory_mb``
0 (the returning turn recomputes what was evicted) and ``--tier2-mb`` (it is loaded from host
RAM). Per arm, over the returning turns (every turn after each session's first): TTFT p50 / p90
(time to the first token), the share of prompt tokens cached, tokens restored from tier 2, bytes
written / read.
Writes ``benchmarks/results/llamacpp_tier2.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from server.config import load_settings  # noqa: E402
from server.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from server.families.model_facts import load_model_facts  # noqa: E402

REPLY = 8


def session_text(i: int, length_words: int) -> str:
    words = " ".join(
        f"step {j}: session {i} read file_{j % 50}.py and ran test {j * 7 % 31}." for j in range(length_words)
    )
    return f"<|im_start|>system\nYou are agent {i}.<|im_end|>\n<|im_start|>user\n{words}<|im_end|>\n"


def arm(args: argparse.Namespace, tier2_mb: int) -> dict[str, float]:
    from server.engines.llamacpp.engine import LlamaCppEngine

    settings = load_settings(
        None,
        engine="llamacpp",
        model=args.model,
        max_model_len=args.ctx,
        threads=args.threads,
        prefix_cache={"memory_mb": 0, "policy": args.policy, "tier2": {"memory_mb": tier2_mb}},
    )
    eng = LlamaCppEngine(settings.engine_settings(), load_model_facts(settings, "llamacpp"))

    def ids(text: str) -> list[int]:
        return eng.tokenizer(text, add_special_tokens=False)["input_ids"]

    prompts: list[list[int]] = []
    for i in range(args.sessions):
        words = 8
        while len(ids(session_text(i, words))) < args.length:
            words *= 2
        prompts.append(ids(session_text(i, words))[: args.length])
    greedy = SamplingParams(max_tokens=REPLY, temperature=0.0)
    ttft: list[float] = []
    cached = total = 0

    async def run() -> None:
        nonlocal cached, total
        await eng.start()
        for turn in range(args.turns):
            for i in range(args.sessions):
                t0 = time.perf_counter()
                first: float | None = None
                reply: list[int] = []
                last_cached = 0
                req = GenerationRequest(f"s{i}-{turn}", prompts[i], greedy, session_key=f"s{i}")
                async for chunk in eng.generate(req):
                    if first is None and chunk.token_ids:
                        first = time.perf_counter() - t0
                    reply += chunk.token_ids
                    last_cached = chunk.cached_tokens
                if turn > 0:  # a returning turn
                    ttft.append(first if first is not None else float("nan"))
                    cached += last_cached
                    total += len(prompts[i])
                prompts[i] = prompts[i] + reply + ids(f"<|im_start|>user\nturn {turn}: go on.<|im_end|>\n")
        await eng.shutdown()

    asyncio.run(run())
    extra = eng.stats().extra
    q = statistics.quantiles(ttft, n=10) if len(ttft) > 1 else [ttft[0]] * 9
    return {
        "tier2_mb": tier2_mb,
        "returning_turns": len(ttft),
        "ttft_p50_s": round(statistics.median(ttft), 3),
        "ttft_p90_s": round(q[8], 3),
        "cached_share": round(cached / max(total, 1), 4),
        "restored_tokens": extra.get("tier2_restored_tokens", 0.0),
        "bytes_written": extra.get("tier2_bytes_written", 0.0),
        "bytes_read": extra.get("tier2_bytes_read", 0.0),
        "kv_cells": extra["kv_cells"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--length", type=int, default=1500)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tier2-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--policy", choices=("lru", "session"), default="lru", help="which idle slot goes first")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/llamacpp_tier2")
    args = ap.parse_args()
    if args.sessions * args.length <= args.ctx:
        ap.error("--sessions x --length must exceed --ctx: otherwise nothing is evicted")
    runs: list[dict[str, float]] = []
    for r in range(args.repeat):
        for mb in (0, args.tier2_mb):
            res = arm(args, mb)
            res["round"] = r
            runs.append(res)
            print(json.dumps(res), flush=True)
    meta = {
        "command": " ".join(sys.argv),
        "machine": platform.machine(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    lines = [
        "| tier 2 | round | returning turns | TTFT p50 (s) | TTFT p90 (s) | cached share | restored tokens "
        "| MB read |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in runs:
        lines.append(
            f"| {'off' if not x['tier2_mb'] else str(int(x['tier2_mb'])) + ' MiB'} | {x['round']} | "
            f"{x['returning_turns']} | {x['ttft_p50_s']} | {x['ttft_p90_s']} | {x['cached_share']:.1%} | "
            f"{int(x['restored_tokens'])} | {x['bytes_read'] / 2**20:.0f} |"
        )
    args.out.with_suffix(".md").write_text(f"`{meta['command']}`\n\n" + "\n".join(lines) + "\n")
    print(json.dumps({"runs": runs}))


if __name__ == "__main__":
    main()
