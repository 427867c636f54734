"""The hf engine's decode step on CPU, arms alternated in one process (issue 26).

    .venv/bin/python benchmarks/speed/decode_step_cpu.py [--rows 1,8] [--context 600] [--reps 3]
        [--reorder-on engine|main]

Embedded model (SmolLM2-135M, fp32), torch threads = cores, everything timed on one worker
thread (as the engine's loop runs). Per arm and batch size: B caches of ~``--context`` tokens,
the median of 15 steps after 3 warm-up steps; arms take turns ``--reps`` times (the box's
load drifts) and the best median is printed. Arms:

* ``stock``: transformers' forward and linears (MKL sgemm), each row's attention over its
  own KV (at B = 1 the plain ``model(...)`` forward);
* ``onednn+slots``: the linears as oneDNN matmuls (``linears/onednn.py``) and KV slots
  (``kv/slots.py``: one SDPA a layer), transformers' forward (the engine before fused
  projections and the lean forward);
* ``engine``: what the engine runs now: q/k/v and gate/up fused (``linears/fused.py``),
  the panel kernel's linears (``linears/panel.py``; oneDNN where it cannot be built), KV slots,
  and ``model/lean.py``'s forward instead of transformers' (B = 1 included).

``--reorder-on main`` reorders the oneDNN weights on the main thread, which thereby gets an
OpenMP team of its own, while the steps run on the worker (the engine's layout before it
reordered on its own thread): compare its rows with a default run.
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

from benchmarks.harness.engine_thread import run_like_engine  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--context", type=int, default=600)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--reorder-on", choices=("engine", "main"), default="engine")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from server.engines.hf.kv.growing import cache_kw, growing_cache
    from server.engines.hf.kv.slots import KVSlots
    from server.engines.hf.linears.fused import fuse_projections
    from server.engines.hf.linears.install import install_linears
    from server.engines.hf.model.lean import use_transformers_forward
    from server.engines.hf.model.rows import decode_rows
    from server.model_store import resolve_model

    cpu = torch.device("cpu")
    path = resolve_model("embedded")
    stock = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    fast = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    use_transformers_forward(stock)
    use_transformers_forward(fast)
    arms = [("stock", stock, False), ("onednn+slots", fast, True), ("engine", engine, True)]

    def prepare() -> None:
        with torch.no_grad():
            install_linears(fast, cpu, torch.float32, "onednn")
            fuse_projections(engine)
            install_linears(engine, cpu, torch.float32)

    if args.reorder_on == "main":
        prepare()
    rows = [int(b) for b in args.rows.split(",")]
    best: dict[tuple[str, int], float] = {}

    def caches(model: Any, b: int, pool: KVSlots | None) -> list[Any]:
        out = []
        for i in range(b):
            kv = growing_cache(model.config)
            if pool is not None:
                pool.admit(kv, args.context + 3 * b + 64)
            gen = torch.Generator().manual_seed(i)
            ids = torch.randint(0, 49000, (1, args.context + 3 * i), generator=gen)
            model(input_ids=ids, **cache_kw(model, kv), use_cache=True, logits_to_keep=1)
            out.append(kv)
        return out

    def step_ms(model: Any, b: int, slots: bool) -> float:
        pool = KVSlots(model.config, torch.float32, cpu, 2**30) if slots else None
        kvs = caches(model, b, pool)

        def step() -> None:
            if b == 1 and model is stock:
                model(input_ids=torch.tensor([[17]]), **cache_kw(model, kvs[0]), use_cache=True)
            else:
                decode_rows(model, kvs, [17] * b, cpu, pool)

        times = []
        for i in range(18):
            t0 = time.perf_counter()
            step()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        return 1000 * statistics.median(times)

    def worker() -> None:
        if args.reorder_on == "engine":
            prepare()
        for rep in range(args.reps):
            for b in rows:
                for name, model, slots in arms:
                    ms = step_ms(model, b, slots)
                    best[name, b] = min(best.get((name, b), ms), ms)
                    print(f"rep {rep + 1} rows {b:2d} {name:13s} {ms:6.1f} ms", file=sys.stderr, flush=True)

    run_like_engine(worker)
    names = [name for name, _, _ in arms]
    print(f"| rows | {' | '.join(names)} |  (reordered on the {args.reorder_on} thread)")
    print("|---|" + "---|" * len(names))
    for b in rows:
        cells = " | ".join(f"{best[name, b]:.1f} ms" for name in names)
        print(f"| {b} | {cells} |")


if __name__ == "__main__":
    main()
