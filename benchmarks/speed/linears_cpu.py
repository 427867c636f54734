"""The embedded model's linear layers on CPU: oneDNN's reordered matmul vs the packed-panel kernel.

    .venv/bin/python benchmarks/speed/linears_cpu.py [--rows 1,4,8,16,176,512] [--reps 11]

SmolLM2-135M's 120 layer linears as the engine runs them (fused projections: per layer
qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536; random fp32 weights), for ``--rows``
input rows: ``onednn`` (``OneDNNLinear``, server/engines/hf/linears/onednn.py) against ``panel``
(``PanelLinear``, server/engines/hf/linears/panel.py). Arms alternated on one worker thread (the
engine's layout); the median of ``--reps`` passes, and the weight bytes read per second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness.engine_thread import run_like_engine  # noqa: E402

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) per layer
LAYERS = 30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,4,8,16,176,512")
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()
    lines = ["| rows | onednn | panel | panel / onednn |", "|---|---|---|---|"]

    def worker() -> None:
        import torch

        from server.engines.hf.linears.onednn import OneDNNLinear
        from server.engines.hf.linears.panel import PanelLinear, panel_linear_available

        if not panel_linear_available(torch.device("cpu"), torch.float32):
            raise SystemExit("panel kernel not available (see the warning above)")
        gen = torch.Generator().manual_seed(0)
        plain = [[torch.nn.Linear(i, o, bias=False) for o, i in SHAPES] for _ in range(LAYERS)]
        for layer in plain:
            for lin in layer:
                torch.nn.init.normal_(lin.weight, std=0.05, generator=gen)
        arms = {
            "onednn": [[OneDNNLinear(lin) for lin in layer] for layer in plain],
            "panel": [[PanelLinear(lin) for lin in layer] for layer in plain],
        }
        nbytes = sum(o * i * 4 for o, i in SHAPES) * LAYERS
        for rows in (int(r) for r in args.rows.split(",")):
            xs = [torch.randn(rows, i, generator=gen) for _, i in SHAPES]
            times: dict[str, list[float]] = {name: [] for name in arms}
            for rep in range(args.reps + 1):  # rep 0 warms up
                for name in arms if rep % 2 else list(arms)[::-1]:
                    t0 = time.perf_counter()
                    for layer in arms[name]:
                        for lin, x in zip(layer, xs, strict=True):
                            lin(x)
                    if rep:
                        times[name].append(time.perf_counter() - t0)
            a, b = statistics.median(times["onednn"]), statistics.median(times["panel"])
            lines.append(
                f"| {rows} | {1000 * a:.1f} ms ({nbytes / a / 1e9:.1f} GB/s) "
                f"| {1000 * b:.1f} ms ({nbytes / b / 1e9:.1f} GB/s) | {b / a:.2f}x |"
            )
            print(lines[-1], file=sys.stderr, flush=True)

    run_like_engine(worker)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
