"""Prefill on CPU: transformers' forward, one sequence at a time, vs ``prefill_rows`` (issue 26).

    .venv/bin/python benchmarks/speed/prefill_rows_cpu.py [--reps 3]

Embedded model (SmolLM2-135M, fp32) as the engine runs it (fused projections, oneDNN
linears), on one worker thread. Cases: a fresh 1024-token prompt; a 1024- and a 200-token
chunk on 3,000 cached tokens; 8 sessions' 25-token rests on a 600-token cached prefix (a
burst of sub-agents). Each arm starts from freshly prefilled caches; the best of ``--reps``
timings is printed. ``stock``: one transformers forward per sequence; ``rows``:
``batched_prefill.prefill_rows``, every sequence a row of one forward.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness.engine_thread import run_like_engine  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CASES = ((0, 1024, 1), (3000, 1024, 1), (3000, 200, 1), (600, 25, 8))  # cached, new, sequences


def _case(model: Any, cached: int, new: int, rows: int, reps: int, gen: Any) -> dict[str, float]:
    """Best seconds of each arm for ``rows`` sequences of ``cached`` + ``new`` tokens."""
    import torch

    from server.engines.hf.kv.growing import cache_kw, growing_cache
    from server.engines.hf.model.rows import prefill_rows

    prefix = torch.randint(0, 49000, (cached,), generator=gen).tolist()
    chunks = [torch.randint(0, 49000, (new,), generator=gen).tolist() for _ in range(rows)]

    def forward(kv: Any, ids: list[int]) -> None:
        model(input_ids=torch.tensor([ids]), **cache_kw(model, kv), use_cache=True, logits_to_keep=1)

    def fresh() -> list[Any]:
        caches = [growing_cache(model.config) for _ in range(rows)]
        for kv in caches:
            if cached:
                forward(kv, prefix)
        return caches

    best = {"stock": float("inf"), "rows": float("inf")}
    for _ in range(reps):
        caches = fresh()
        t0 = time.perf_counter()
        for kv, chunk in zip(caches, chunks, strict=True):
            forward(kv, chunk)
        best["stock"] = min(best["stock"], time.perf_counter() - t0)
        caches = fresh()
        t0 = time.perf_counter()
        prefill_rows(model, caches, chunks, [cached] * rows, torch.device("cpu"))
        best["rows"] = min(best["rows"], time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from server.engines.hf.linears.fused import fuse_projections
    from server.engines.hf.linears.install import install_linears
    from server.model_store import resolve_model

    cpu = torch.device("cpu")
    model = AutoModelForCausalLM.from_pretrained(resolve_model("embedded"), dtype=torch.float32).eval()
    lines = [
        "| cached | new | sequences | stock (a forward each) | prefill_rows (one forward) |",
        "|---|---|---|---|---|",
    ]

    def worker() -> None:  # the engine's layout: model work on one thread (onednn_linear.py)
        fuse_projections(model)
        install_linears(model, cpu, torch.float32)
        gen = torch.Generator().manual_seed(0)
        for cached, new, rows in CASES:
            best = _case(model, cached, new, rows, args.reps, gen)
            ms = {k: f"{1000 * v:.0f} ms" for k, v in best.items()}
            lines.append(f"| {cached} | {new} | {rows} | {ms['stock']} | {ms['rows']} |")
            print(lines[-1], file=sys.stderr, flush=True)

    run_like_engine(worker)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
