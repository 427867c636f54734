"""In process, no HTTP: the llamacpp engine vs llama-cpp-python's own high-level ``Llama`` on one GGUF.

    python benchmarks/speed/llamacpp_peer.py [--model FILE.gguf] [--threads 2] [--ctx 8192]
        [--tokens 64] [--prefill 4000] [--repeat N] [--rows decode,shared,prefill] [--out PATH]

The peer when llama-server is not built (``benchmarks/speed/llamacpp_bench.py`` runs llama-server over
HTTP). Each arm runs in its own subprocess (its peak RSS is its own), the same token ids for
both: one-session decode (tok/s after the first token, on a cached prompt), 8 sessions sharing
a ~600-token prefix (aggregate generated tok/s: the engine batches them; ``Llama`` has one
sequence, so it runs them one after the other, reusing the prefix it still holds), a cold
``--prefill``-token prefill (prompt tok/s), peak RSS (and it less the GGUF's size). Greedy,
``--tokens`` a reply; ``--rows`` the figures to take (e.g. ``prefill`` alone: the cold prompt after
a one-token warm-up; its cached tokens are reported). ``--repeat N`` runs the
arms N times each, alternating (engine, Llama, engine, ...), and reports each figure's median: on
a shared box the load moves between runs, so compare ratios within one such run. Writes
``benchmarks/results/llamacpp_peer.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from server.families.model_facts import load_model_facts  # noqa: E402
from server.model_store import embedded_gguf  # noqa: E402

N = 64  # tokens a reply (--tokens)
PREFILL = 4000  # tokens of the cold prompt (--prefill)
COUNT = "Count from 1 to 300, separated by commas."
USER = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


def prompts(tokenizer) -> dict[str, list]:
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    system = "<|im_start|>system\nYou are the build bot. " + " ".join(
        f"Rule {i}: before you edit module_{i}.py, read it, run its tests, and write down what failed."
        for i in range(30)
    )
    turn = "<|im_end|>\n" + USER
    words = " ".join(f"line {i}: the job wrote {i * 7 % 97} records to shard {i % 13}." for i in range(400))
    return {
        "one": [ids(USER.format(q=COUNT))],
        "shared": [
            ids(system + turn.format(q=f"Session {i}: which module first, and why?")) for i in range(8)
        ],
        "warm": [ids(system + turn.format(q="hi"))],
        "cold": [ids(f"<|im_start|>user\n{words}")[:PREFILL]],
    }


def gguf_file(model: str) -> Path:
    return embedded_gguf() if model == "embedded" else Path(model)


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def arm_engine(model: str, threads: int, ctx: int, rows: set[str]) -> dict[str, float]:
    from server.config import load_settings
    from server.engines.base import GenerationRequest, SamplingParams
    from server.engines.llamacpp.engine import LlamaCppEngine

    settings = load_settings(None, engine="llamacpp", model=model, max_model_len=ctx, threads=threads)
    eng = LlamaCppEngine(settings.engine_settings(), load_model_facts(settings, "llamacpp"))
    p = prompts(eng.tokenizer)
    greedy = SamplingParams(max_tokens=N, temperature=0.0)
    out: dict[str, float] = {}
    cached: dict[str, int] = {}

    async def stamps(rid: str, ids: list[int], sampling: SamplingParams = greedy) -> list[float]:
        times = []
        async for chunk in eng.generate(GenerationRequest(rid, ids, sampling, session_key=rid)):
            times += [time.perf_counter()] * max(1, len(chunk.token_ids))
            cached[rid] = chunk.cached_tokens
        return times

    async def run() -> None:
        await eng.start()
        one = p["one"][0]
        await stamps("w1", one, SamplingParams(max_tokens=1, temperature=0.0))
        if "decode" in rows:
            t = await stamps("one", one)
            out["decode_1_tok_s"] = (len(t) - 1) / (t[-1] - t[0])
        if "shared" in rows:
            await stamps("w8", p["warm"][0], SamplingParams(max_tokens=1, temperature=0.0))
            t0 = time.perf_counter()
            res = await asyncio.gather(*(stamps(f"s{i}", ids) for i, ids in enumerate(p["shared"])))
            out["shared_8_tok_s"] = sum(map(len, res)) / (time.perf_counter() - t0)
        if "prefill" not in rows:
            await eng.shutdown()
            return
        cold = p["cold"][0]
        t0 = time.perf_counter()
        await stamps("cold", cold, SamplingParams(max_tokens=1, temperature=0.0))
        out["prefill_tok_s"] = len(cold) / (time.perf_counter() - t0)
        out["prefill_cached_tokens"] = cached["cold"]
        out["prefill_tokens"] = len(cold)
        await eng.shutdown()

    asyncio.run(run())
    return out


def arm_llama(model: str, threads: int, ctx: int, rows: set[str]) -> dict[str, float]:
    import llama_cpp
    from transformers import AutoTokenizer

    from server.model_store import tokenizer_folder

    p = prompts(AutoTokenizer.from_pretrained(tokenizer_folder(model)))
    path = str(gguf_file(model))
    llm = llama_cpp.Llama(
        path, n_ctx=ctx, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    eos = llm.token_eos()
    out: dict[str, float] = {}

    def gen(ids: list[int], n: int = N) -> list[float]:
        times = []
        for tok in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0):
            times.append(time.perf_counter())
            if tok == eos or len(times) >= n:
                break
        return times

    one = p["one"][0]
    gen(one, 1)
    if "decode" in rows:
        t = gen(one)
        out["decode_1_tok_s"] = (len(t) - 1) / (t[-1] - t[0])
    if "shared" in rows:
        gen(p["warm"][0], 1)
        t0 = time.perf_counter()
        n = sum(len(gen(ids)) for ids in p["shared"])
        out["shared_8_tok_s"] = n / (time.perf_counter() - t0)
    if "prefill" not in rows:
        return out
    cold = p["cold"][0]
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(cold)
    out["prefill_tok_s"] = len(cold) / (time.perf_counter() - t0)
    out["prefill_tokens"] = len(cold)
    return out


def main() -> None:
    global N, PREFILL
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded", help="'embedded' or a .gguf file")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=N, help="tokens a reply")
    ap.add_argument("--prefill", type=int, default=PREFILL, help="tokens of the cold prompt")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each arm, alternating (medians)")
    ap.add_argument("--rows", default="decode,shared,prefill", help="which figures (comma-separated)")
    ap.add_argument("--arm", choices=["engine", "llama"], help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "llamacpp_peer"))
    args = ap.parse_args()
    N, PREFILL = args.tokens, args.prefill
    if args.arm:  # a subprocess: one arm, its figures as JSON on the last line
        fn = arm_engine if args.arm == "engine" else arm_llama
        res = fn(args.model, args.threads, args.ctx, set(args.rows.split(",")))
        res["peak_rss_mb"] = peak_rss_mb()
        res["peak_rss_less_file_mb"] = res["peak_rss_mb"] - gguf_file(args.model).stat().st_size / 2**20
        print(json.dumps(res))
        return
    each: dict[str, list[dict[str, float]]] = {}
    loads = [os.getloadavg()[0]]
    for _ in range(args.repeat):
        for arm, label in (("engine", "agentserve llamacpp engine"), ("llama", "llama-cpp-python Llama")):
            cmd = [sys.executable, __file__, "--arm", arm, "--model", args.model]
            cmd += ["--threads", str(args.threads), "--ctx", str(args.ctx)]
            cmd += ["--tokens", str(N), "--prefill", str(PREFILL), "--rows", args.rows]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if done.returncode != 0:
                sys.exit(f"{label} failed:\n{done.stderr[-3000:]}")
            each.setdefault(label, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
            loads.append(os.getloadavg()[0])
            print(label, each[label][-1], file=sys.stderr, flush=True)
    runs = {label: medians(rs) for label, rs in each.items()}
    write(args, runs, each, loads)


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the runs of one arm."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def write(
    args: argparse.Namespace,
    runs: dict[str, dict[str, float]],
    each: dict[str, list[dict[str, float]]],
    loads: list[float],
) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    meta = {
        "model": gguf_file(args.model).name,
        "file_mb": round(gguf_file(args.model).stat().st_size / 2**20),
        "tokens": N,
        "prefill": PREFILL,
        "threads": args.threads,
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "commit": commit.stdout.strip(),
        "command": "python benchmarks/speed/llamacpp_peer.py " + " ".join(sys.argv[1:]),
        "repeat": args.repeat,
        "load_average_1min": [round(x, 1) for x in loads],  # before the first arm, after each
    }
    doc = {"meta": meta, "runs": runs, "each": each}
    Path(args.out + ".json").write_text(json.dumps(doc, indent=2) + "\n")
    rows = [
        ("1 session decode (tok/s)", "decode_1_tok_s"),
        ("8 sessions, shared ~600-token prefix (aggregate tok/s)", "shared_8_tok_s"),
        ("cold prefill (prompt tok/s)", "prefill_tok_s"),
        ("cold prefill prompt (tokens)", "prefill_tokens"),
        ("peak resident memory (MB)", "peak_rss_mb"),
        ("peak resident memory less the file (MB)", "peak_rss_less_file_mb"),
    ]
    names = list(runs)
    lines = [f"# llamacpp engine vs llama-cpp-python's Llama, in process: {meta['model']}", ""]
    lines += ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, key in rows:
        if key not in runs[names[0]]:
            continue
        cells = " | ".join(f"{runs[n].get(key, float('nan')):.1f}" for n in names)
        lines.append(f"| {label} | {cells} |")
    ratio = [
        f"{label}: {runs[names[0]][key] / runs[names[1]][key]:.2f}x"
        for label, key in rows[:3]
        if len(names) == 2 and runs[names[1]].get(key) and key in runs[names[0]]
    ]
    lines += ["", "engine / Llama: " + "; ".join(ratio)] if ratio else []
    load = ", ".join(f"{x:.1f}" for x in loads)
    lines += [
        "",
        f"`{meta['command']}` at {meta['commit']}, {meta['machine']}, {args.threads} threads; "
        f"medians of {args.repeat} alternating run(s) per arm; 1-min load average {load}.",
    ]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
