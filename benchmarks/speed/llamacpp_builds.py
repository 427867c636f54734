"""Raw llama.cpp speed of one GGUF under two or more builds of llama-cpp-python, arms alternated.

    python benchmarks/speed/llamacpp_builds.py MODEL.gguf DIR [DIR ...] [--rounds 2] [--threads 2]

Each DIR is a ``pip install --no-deps --target DIR llama_cpp_python-*.whl`` of one build (say the
AVX2-only wheel and the AVX-512 one that ``scripts/install_llamacpp.sh`` builds where the CPU has
it). Per round and build, in a fresh process: a 2,048-token prefill in 512-token chunks (one
sequence, flash attention, f16 KV, as the llamacpp engine runs it) and 64 one-row decode steps
on a 512-token context; tokens per second, and the median per build at the end. No server and
no sampling: only the kernels differ between the arms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROBE = r"""
import json, sys, time
import llama_cpp
path, threads = sys.argv[1], int(sys.argv[2])
llama_cpp.llama_backend_init()
model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
cp = llama_cpp.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max, cp.no_perf = 4096, 512, 512, 1, True
cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
cp.n_threads = cp.n_threads_batch = threads
ctx = llama_cpp.llama_init_from_model(model, cp)
mem = llama_cpp.llama_get_memory(ctx)
vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
b = llama_cpp.llama_batch_init(512, 0, 1)
def run(toks, start):
    for i, t in enumerate(toks):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, 0
        b.seq_id[i][0] = 0
    b.logits[len(toks) - 1], b.n_tokens = 1, len(toks)
    assert llama_cpp.llama_decode(ctx, b) == 0
t0 = time.perf_counter()
for c in range(4):
    run([(1000 + 7 * (c * 512 + i)) % (vocab - 1000) + 500 for i in range(512)], c * 512)
prefill = 2048 / (time.perf_counter() - t0)
llama_cpp.llama_memory_seq_rm(mem, 0, 512, -1)
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
            env = {**os.environ, "PYTHONPATH": d}
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
