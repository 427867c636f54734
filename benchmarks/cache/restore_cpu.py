"""Restoring a prefix-cache match into a new request's cache: layer by layer vs straight into its slot.

    .venv/bin/python benchmarks/cache/restore_cpu.py [--tokens 520,4000,16000] [--block 32] [--reps 7]

Every request that hits the prefix cache first copies the match's blocks (each
``[layers, 2, kv_heads, block, head_dim]``) into its own cache. The embedded model's KV shape
(SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64, fp32), ``--tokens`` cached tokens in blocks
of ``--block``. Arm ``layers``: what a cache outside the ``KVSlots`` pool does (and what every
cache did before ``KVSlots.restore``): the blocks concatenated into one tensor
(``kv_blocks.cached_kv``), then copied layer by layer (``kv_growing.restore``). Arm ``slot``:
``KVSlots.restore``, one copy a block into the slot's view of all layers. Arms alternated on
one worker thread (the engine's layout); the best of ``--reps`` medians of 3 is printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness.engine_thread import run_like_engine  # noqa: E402

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 30, 9, 3, 64


def _case(tokens: int, block: int, reps: int) -> tuple[float, float]:
    import torch
    from transformers import LlamaConfig

    from server.engines.hf.kv.blocks import cached_kv
    from server.engines.hf.kv.growing import growing_cache, restore
    from server.engines.hf.kv.slots import KVSlots

    config = LlamaConfig(
        num_attention_heads=HEADS,
        num_hidden_layers=LAYERS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        hidden_size=HEADS * HEAD_DIM,
    )
    gen = torch.Generator().manual_seed(0)
    sizes = [block] * (tokens // block) + ([tokens % block] if tokens % block else [])
    parts = [torch.randn(LAYERS, 2, KV_HEADS, n, HEAD_DIM, generator=gen) for n in sizes]
    pool = KVSlots(config, torch.float32, torch.device("cpu"), 2**34)

    def layers() -> None:
        restore(growing_cache(config), cached_kv(parts, torch.device("cpu")))

    def slot() -> None:
        kv = growing_cache(config)
        assert pool.admit(kv, tokens + 1) is not None and pool.restore(kv, parts)
        del kv  # its slot comes back for the next run
        pool.collect()

    best = {"layers": float("inf"), "slot": float("inf")}
    for rep in range(reps):
        for name, fn in (
            (("layers", layers), ("slot", slot)) if rep % 2 == 0 else (("slot", slot), ("layers", layers))
        ):
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            best[name] = min(best[name], statistics.median(times))
    return 1000 * best["layers"], 1000 * best["slot"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="520,4000,16000")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    lines = [
        "| cached tokens | layers (concatenate, then each layer) | slot (KVSlots.restore) |",
        "|---|---|---|",
    ]

    def worker() -> None:
        for tokens in (int(t) for t in args.tokens.split(",")):
            full, direct = _case(tokens, args.block, args.reps)
            lines.append(f"| {tokens} | {full:.1f} ms | {direct:.1f} ms ({full / direct:.1f}x faster) |")
            print(lines[-1], file=sys.stderr, flush=True)

    run_like_engine(worker)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
