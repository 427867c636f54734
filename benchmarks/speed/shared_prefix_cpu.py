"""A pooled decode step's attention on CPU: one SDPA over every row's copy vs the shared prefix read once.

    .venv/bin/python benchmarks/speed/shared_prefix_cpu.py [--rows 2,4,8,16] [--prefix 64,256,620,2000]
        [--own 64] [--reps 10]

The embedded model's attention shapes (SmolLM2-135M: 30 layers, 9 query heads over 3 KV heads,
head_dim 64, fp32) on a ``KVSlots`` pool whose rows hold the same ``--prefix`` tokens and
``--own`` tokens of their own (row i ``2 i`` fewer: padding). Per layer, ``full``: what a pooled
step runs without sharing (one SDPA over the rows with the padding mask); ``shared``:
``shared_prefix.shared_prefix_attention``. Both timed over 30 layers on one worker thread
(the engine's layout), arms alternated; the best of ``--reps`` medians is printed. These
numbers set ``shared_prefix.MIN_ROWS`` / ``MIN_SAVED``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness.engine_thread import run_like_engine  # noqa: E402

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 30, 9, 3, 64


def _case(rows: int, prefix: int, own: int, reps: int) -> tuple[float, float]:
    import torch
    import torch.nn.functional as F

    from server.engines.hf.kv.slots import KVSlots, PooledStep
    from server.engines.hf.model.shared_prefix import shared_prefix_attention

    config = SimpleNamespace(
        num_attention_heads=HEADS,
        num_hidden_layers=LAYERS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        hidden_size=HEADS * HEAD_DIM,
    )
    pool = KVSlots(config, torch.float32, torch.device("cpu"), 2**34)
    lengths = [prefix + own - 2 * i for i in range(rows)]
    assert pool.ensure(max(lengths) + 1) and pool.fit(rows, max(lengths) + 1)
    gen = torch.Generator().manual_seed(0)
    for k, v in zip(pool.k, pool.v, strict=True):
        k.normal_(generator=gen)
        v.normal_(generator=gen)
        k[:, :, :prefix] = k[:1, :, :prefix]  # the rows' shared prefix: the same keys/values
        v[:, :, :prefix] = v[:1, :, :prefix]
    slots = list(range(rows))
    plain, split = PooledStep(pool, slots, lengths), PooledStep(pool, slots, lengths, prefix)
    q = torch.randn(rows, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM, generator=gen)
    scale = HEAD_DIM**-0.5

    def full() -> None:
        for i in range(LAYERS):
            k, v = pool.k[i][:, :, : plain.longest], pool.v[i][:, :, : plain.longest]
            F.scaled_dot_product_attention(q, k, v, attn_mask=plain.mask, scale=scale)

    def shared() -> None:
        for i in range(LAYERS):
            k, v = pool.k[i][:, :, : split.longest], pool.v[i][:, :, : split.longest]
            shared_prefix_attention(q, k, v, split, scale)

    best = {"full": float("inf"), "shared": float("inf")}
    for rep in range(reps):
        for name, fn in (
            (("full", full), ("shared", shared)) if rep % 2 == 0 else (("shared", shared), ("full", full))
        ):
            fn()
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            best[name] = min(best[name], statistics.median(times))
    return 1000 * best["full"], 1000 * best["shared"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="2,4,8,16")
    ap.add_argument("--prefix", default="64,256,620,2000")
    ap.add_argument("--own", type=int, default=64)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    lines = ["| rows | shared prefix | full (every row's copy) | shared (read once) |", "|---|---|---|---|"]

    def worker() -> None:
        for rows in (int(r) for r in args.rows.split(",")):
            for prefix in (int(p) for p in args.prefix.split(",")):
                full, shared = _case(rows, prefix, args.own, args.reps)
                lines.append(f"| {rows} | {prefix} | {full:.1f} ms | {shared:.1f} ms |")
                print(lines[-1], file=sys.stderr, flush=True)

    run_like_engine(worker)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
