"""The hf engine's KV cache, before and after ``GrowingLayer``: one agent turn, arms alternated.

    python benchmarks/cache/kv_append.py [--cached 3000] [--new 200] [--decode 16] [--reps 3] [--threads 2]

One turn as the engine runs it, on the embedded model with the bare transformers forward: restore
``--cached`` tokens of KV from a prefix-cache match (one stacked tensor, as ``cached_kv`` gives),
prefill ``--new`` tokens, then ``--decode`` greedy steps. Arm ``dynamic`` uses transformers'
``DynamicCache`` (a ``torch.cat`` of the whole cache every forward), arm ``growing`` the engine's
``growing_cache``. The arms alternate ``--reps`` times so both see the same load; prints the
median time-to-first-token (restore + prefill) and decode ms/token of each, and their ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cached", type=int, default=3000)
    ap.add_argument("--new", type=int, default=200)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from server.engines.hf.kv.growing import cache_kw, growing_cache, restore
    from server.model_store import resolve_model

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    model = AutoModelForCausalLM.from_pretrained(resolve_model("embedded"), dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (1, args.cached + args.new), generator=gen)
    warm = DynamicCache(config=model.config)
    model(input_ids=ids[:, : args.cached], **cache_kw(model, warm), use_cache=True, logits_to_keep=1)
    stacked = torch.stack([torch.stack((lay.keys[0], lay.values[0])) for lay in warm.layers])
    arms: dict[str, Any] = {
        "dynamic": lambda: DynamicCache(config=model.config),
        "growing": lambda: growing_cache(model.config),
    }
    ttft: dict[str, list[float]] = {a: [] for a in arms}
    decode: dict[str, list[float]] = {a: [] for a in arms}
    tokens: dict[str, list[int]] = {}
    for rep in range(args.reps + 1):  # rep 0 warms up
        for name, make in arms.items():
            t0 = time.perf_counter()
            kv = make()
            restore(kv, stacked)  # as the engine does (DynamicCache: update per layer)
            out = model(
                input_ids=ids[:, args.cached :], **cache_kw(model, kv), use_cache=True, logits_to_keep=1
            )
            token = out.logits[0, -1].argmax().view(1, 1)
            t1 = time.perf_counter()
            seen = [int(token)]
            for _ in range(args.decode):
                token = model(input_ids=token, **cache_kw(model, kv), use_cache=True).logits[0, -1].argmax()
                token = token.view(1, 1)
                seen.append(int(token))
            t2 = time.perf_counter()
            if rep:
                ttft[name].append(t1 - t0)
                decode[name].append((t2 - t1) / args.decode)
            tokens[name] = seen
    same = tokens["dynamic"] == tokens["growing"]
    print(
        f"# python benchmarks/cache/kv_append.py --cached {args.cached} --new {args.new} "
        f"--decode {args.decode} "
        f"--reps {args.reps} --threads {args.threads}; load {os.getloadavg()[0]:.1f}; same tokens: {same}"
    )
    med = {a: (statistics.median(ttft[a]), statistics.median(decode[a])) for a in arms}
    for a, (t, d) in med.items():
        print(f"{a:8s} TTFT (restore + prefill) {1000 * t:8.1f} ms   decode {1000 * d:7.1f} ms/token")
    (td, dd), (tg, dg) = med["dynamic"], med["growing"]
    print(f"growing / dynamic: TTFT {tg / td:.2f}x, decode {dg / dd:.2f}x")


if __name__ == "__main__":
    main()
