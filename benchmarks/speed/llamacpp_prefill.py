"""The floor of a cold prefill: one raw ``llama_decode`` of the same prompt rows under each context setting.

    python benchmarks/speed/llamacpp_prefill.py [--model FILE.gguf] [--threads 2] [--rows 512]
        [--repeat 3] [--arms base,fa,...] [--out PATH]

No engine, no sampler, no event loop: the model is loaded once and every arm is a context of its
own (made once), so what differs between arms is only the context's parameters (flash attention,
``n_ubatch``, pool size, sequences, cells other sequences hold, logits rows, threads). Each round
times every arm once, in turn (``--repeat`` rounds, alternating: on a shared box compare ratios
within one run); a timing is the seconds of the prompt's decode calls (``--rows`` tokens in
``n_batch`` chunks), after its own sequence was dropped. ``occupied`` cells are filled by another
sequence first (untimed), as idle sessions' cells are in the engine's unified pool.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from server.model_store import embedded_gguf  # noqa: E402


@dataclass(frozen=True)
class Arm:
    fa: bool = False  # flash attention
    n_batch: int = 512
    n_ubatch: int = 512
    n_ctx: int = 4096
    n_seq: int = 1
    unified: bool = False
    occupied: int = 0  # cells held by another sequence before the prompt
    logits_all: bool = False  # every row's logits, not only the last
    threads_batch: int = 0  # 0: --threads


LLAMA = Arm()  # llama-cpp-python's Llama(n_ctx=4096, n_batch=512): its defaults
ENGINE = Arm(fa=True, n_batch=544, n_ubatch=544, n_ctx=8192, n_seq=32, unified=True, occupied=1300)
ARMS: dict[str, Arm] = {
    "llama": LLAMA,
    "llama_fa": replace(LLAMA, fa=True),
    "llama_ub544": replace(LLAMA, n_batch=544, n_ubatch=544),
    "llama_8192": replace(LLAMA, n_ctx=8192),
    "llama_seq32": replace(LLAMA, n_seq=32, unified=True),
    "llama_occ": replace(LLAMA, n_seq=32, unified=True, occupied=1300),
    "llama_logits_all": replace(LLAMA, logits_all=True),
    "engine": ENGINE,
    "engine_nofa": replace(ENGINE, fa=False),
    "engine_ub512": replace(ENGINE, n_batch=512, n_ubatch=512),
    "engine_empty": replace(ENGINE, occupied=0),
    "engine_b1024": replace(ENGINE, n_batch=1056, n_ubatch=1056),
    "engine_b2048": replace(ENGINE, n_batch=2080, n_ubatch=2080),
}


class Ctx:
    def __init__(self, llama_cpp, model, arm: Arm, threads: int) -> None:
        self.lc = llama_cpp
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = arm.n_ctx
        cp.n_batch = arm.n_batch
        cp.n_ubatch = arm.n_ubatch
        cp.n_seq_max = arm.n_seq
        cp.kv_unified = arm.unified
        cp.no_perf = True
        on, off = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.flash_attn_type = on if arm.fa else off
        cp.n_threads = threads
        cp.n_threads_batch = arm.threads_batch or threads
        self.ctx = llama_cpp.llama_init_from_model(model, cp)
        assert self.ctx, arm
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.arm = arm
        self.batch = llama_cpp.llama_batch_init(arm.n_batch, 0, 1)

    def feed(self, tokens: list[int], seq: int, last_logits: bool) -> float:
        """Decode ``tokens`` as sequence ``seq`` from position 0, ``n_batch`` at a time; the seconds."""
        b, n = self.batch, self.arm.n_batch
        t0 = time.perf_counter()
        for at in range(0, len(tokens), n):
            part = tokens[at : at + n]
            for i, t in enumerate(part):
                b.token[i] = t
                b.pos[i] = at + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = self.arm.logits_all or (last_logits and at + i == len(tokens) - 1)
            b.n_tokens = len(part)
            assert self.lc.llama_decode(self.ctx, b) == 0
        return time.perf_counter() - t0

    def prefill(self, tokens: list[int]) -> float:
        self.lc.llama_memory_seq_rm(self.mem, 0, 0, -1)
        return self.feed(tokens, 0, True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded", help="'embedded' or a .gguf file")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rows", type=int, default=512, help="prompt tokens")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated: " + ", ".join(ARMS))
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args()
    import llama_cpp

    quiet = llama_cpp.llama_log_callback(lambda *a: None)  # kept alive: llama.cpp calls it
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    path = embedded_gguf() if args.model == "embedded" else Path(args.model)
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    prompt = [(i * 7919 + 13) % (n_vocab - 1000) + 500 for i in range(args.rows)]  # fixed ids
    other = [(i * 104729 + 7) % (n_vocab - 1000) + 500 for i in range(4096)]
    names = args.arms.split(",")
    ctxs = {}
    for name in names:
        c = Ctx(llama_cpp, model, ARMS[name], args.threads)
        if c.arm.occupied:
            c.feed(other[: c.arm.occupied], 1, False)
        c.prefill(prompt[:32])  # a first small decode: buffers allocated before any timing
        ctxs[name] = c
    secs: dict[str, list[float]] = {n: [] for n in names}
    loads = [round(os.getloadavg()[0], 1)]
    for r in range(args.repeat):
        for name in names:
            secs[name].append(ctxs[name].prefill(prompt))
            print(r, name, f"{args.rows / secs[name][-1]:.1f} tok/s", file=sys.stderr, flush=True)
        loads.append(round(os.getloadavg()[0], 1))
    med = {n: args.rows / statistics.median(s) for n, s in secs.items()}
    ref = med.get("llama") or next(iter(med.values()))
    doc = {
        "model": path.name,
        "rows": args.rows,
        "threads": args.threads,
        "tok_s_median": {n: round(v, 2) for n, v in med.items()},
        "vs_llama": {n: round(v / ref, 3) for n, v in med.items()},
        "tok_s_each": {n: [round(args.rows / x, 2) for x in s] for n, s in secs.items()},
        "arms": {n: asdict(ARMS[n]) for n in names},
        "load_average_1min": loads,
        "command": "python benchmarks/speed/llamacpp_prefill.py " + " ".join(sys.argv[1:]),
    }
    text = json.dumps(doc, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
