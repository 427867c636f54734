"""Raw llama.cpp speed of one GGUF under two or more builds of llama-cpp-python, arms alternated.

    python benchmarks/speed/llamacpp_builds.py MODEL.gguf DIR [DIR ...] [--rounds 2] [--threads 2]

Each DIR is a ``pip install --no-deps --target DIR llama_cpp_python-*.whl`` of one build (say the
AVX2-only wheel and the AVX-512 one that ``scripts/install_llamacpp.sh`` builds where the CPU has
it). Per round and build, in a fresh process: a 2,048-token prefill in 512-token chunks (one
sequence, through the engine's own ``LlamaRuntime``: its context, flash attention, f16 KV) and
64 one-row decode steps on a 512-token context; tokens per second, and the median per build at
the end. No server and no sampling: only the kernels differ between the arms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, sys, time
from pathlib import Path
from server.engines.llamacpp.batch import Row
from server.engines.llamacpp.runtime import LlamaRuntime
rt = LlamaRuntime(Path(sys.argv[1]), int(sys.argv[2]))
rt.open(4096, 1, 512)  # the engine's own context (flash attention, unified f16 KV), one sequence
def run(toks, start):
    rt.decode([Row(t, start + i, 0, i == len(toks) - 1) for i, t in enumerate(toks)])
t0 = time.perf_counter()
for c in range(4):
    run([(1000 + 7 * (c * 512 + i)) % (rt.n_vocab - 1000) + 500 for i in range(512)], c * 512)
prefill = 2048 / (time.perf_counter() - t0)
rt.seq_trim(0, 512)
t0 = time.perf_counter()
for k in range(64):
    run([500 + k], 512 + k)
print(json.dumps({"prefill_tok_s": prefill, "decode_tok_s": 64 / (time.perf_counter() - t0)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("builds", nargs="+", help="folders, each holding one llama_cpp build (pip --target)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {d: [] for d in args.builds}
    for r in range(args.rounds):
        for d in args.builds:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([d, str(ROOT)])}  # the build's llama_cpp first
            out = subprocess.run(
                [sys.executable, "-c", PROBE, args.model, str(args.threads)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[d].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {d}: {runs[d][-1]}", file=sys.stderr, flush=True)
    for d, rs in runs.items():
        med = {k: round(statistics.median(x[k] for x in rs), 1) for k in rs[0]}
        print(json.dumps({"build": d, "model": os.path.basename(args.model), "rounds": len(rs), **med}))


if __name__ == "__main__":
    main()
