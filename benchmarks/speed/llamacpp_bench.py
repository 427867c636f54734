"""agentserve's llamacpp engine vs llama.cpp's own llama-server on the same GGUF, side by side.

    python benchmarks/speed/llamacpp_bench.py [--model FILE.gguf] [--llama-server PATH] [--hf] [--threads 2]
        [--ctx 8192] [--repeat N] [--replay-sessions 4] [--replay-context 4096] [--out STEM]

Each server runs as its own process, one after the other, with the same GGUF, threads and
requests (OpenAI chat completions over HTTP, temperature 0): one-session decode (tok/s between
a 1-token and a 64-token reply on a cached prompt), 8 concurrent sessions sharing a ~600-token
system prompt (aggregate generated tok/s, wall clock), a cold ~4k-token prefill (prompt tok/s),
an agent replay (the seeded synthetic agent sessions of ``benchmarks/harness/trace_gen.py``, one
session after another, every turn's prompt the trace's own history with its tools, rendered once
by agentserve's ``/tokenize`` and sent to every server as the same token ids, an 8-token reply:
wall time and the share of prompt tokens the server reports cached), and the
process's peak resident memory (VmHWM). ``--repeat N`` runs the arms N times, alternating, and
reports each figure's median (the box is shared: compare ratios within one run). ``--hf`` adds
agentserve's hf engine (the GGUF converted to fp32). llama-server comes from
``scripts/install_llamacpp.sh --tools`` (the same llama.cpp and flags as the wheel). Writes
``benchmarks/results/llamacpp.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.trace_gen import Session, generate_sessions  # noqa: E402
from server.model_store import embedded_gguf  # noqa: E402
from server.ports import free_port, wait_for_health  # noqa: E402

SYSTEM = "You are the build bot of a large repository. " + " ".join(
    f"Rule {i}: before you edit module_{i}.py, read it, run its tests, and write down what failed."
    for i in range(30)
)  # ~600 tokens
QUESTIONS = [f"Session {i}: which module should I read first, and why? Answer in detail." for i in range(8)]
COUNT = "Count from 1 to 300, separated by commas, and nothing else."


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


MODEL = {"name": "m"}  # the served model's id (/v1/models)


def chat(url: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[float, dict[str, Any]]:
    body = {"model": MODEL["name"], "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()["usage"]


PROMPTS: list[list[int]] = []  # the replay's prompts as token ids: agentserve's /tokenize, once


def replay(url: str, sessions: list[Session]) -> dict[str, float]:
    """The agent sessions one after another, each turn's prompt the trace's history: wall, hit.

    Every server gets the same token ids (``/v1/completions``): the first arm's ``/tokenize``
    renders each turn with its tools once (a GGUF's own template may leave the tools out)."""
    if not PROMPTS:
        for s in sessions:
            for turn in s.turns:
                body: dict[str, Any] = {"model": MODEL["name"], "messages": s.messages[: turn.end]}
                body["tools"] = s.tools
                r = httpx.post(url + "/tokenize", json=body, timeout=600)
                r.raise_for_status()
                PROMPTS.append(r.json()["tokens"])
    prompt = cached = 0
    t0 = time.perf_counter()
    for ids in PROMPTS:
        body = {"model": MODEL["name"], "prompt": ids, "max_tokens": 8, "temperature": 0.0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=600)
        r.raise_for_status()
        usage = r.json()["usage"]
        prompt += usage["prompt_tokens"]
        cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "replay_wall_s": time.perf_counter() - t0,
        "replay_hit_pct": 100.0 * cached / max(prompt, 1),
        "replay_turns": len(PROMPTS),
        "replay_prompt_tokens": prompt,
    }


def measure(url: str, nonce: str, sessions: list[Session]) -> dict[str, float]:
    out: dict[str, float] = {}
    MODEL["name"] = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    # one session: decode rate on a cached prompt, a 1-token reply subtracted
    msgs = [{"role": "user", "content": f"{nonce} {COUNT}"}]
    chat(url, msgs, 1)  # warm: the prompt is cached after this
    t1, _ = chat(url, msgs, 1)
    tn, usage = chat(url, msgs, 64)
    out["decode_1_tok_s"] = (usage["completion_tokens"] - 1) / max(tn - t1, 1e-9)
    out["decode_1_tokens"] = usage["completion_tokens"]
    # 8 sessions sharing a system prompt: the prefix computed once (warm), then 8 at once
    system = {"role": "system", "content": f"{nonce} {SYSTEM}"}
    chat(url, [system, {"role": "user", "content": "hi"}], 1)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(8) as pool:
        jobs = [pool.submit(chat, url, [system, {"role": "user", "content": q}], 64) for q in QUESTIONS]
        usages = [j.result()[1] for j in jobs]
    wall = time.perf_counter() - t0
    out["shared_8_tok_s"] = sum(u["completion_tokens"] for u in usages) / wall
    out["shared_8_prompt_tokens"] = usages[0]["prompt_tokens"]
    out["shared_8_wall_s"] = wall
    # cold prefill of ~4k tokens (a nonce first: nothing cached)
    words = " ".join(f"line {i}: the job wrote {i * 7 % 97} records to shard {i % 13}." for i in range(280))
    dt, usage = chat(url, [{"role": "user", "content": f"cold {nonce} {time.time()} {words}"}], 1)
    out["prefill_tokens"] = usage["prompt_tokens"]
    out["prefill_tok_s"] = usage["prompt_tokens"] / dt
    if sessions:
        out.update(replay(url, sessions))
    return out


def run_server(
    name: str, cmd: list[str], env: dict[str, str], port: int, sessions: list[Session]
) -> dict[str, float]:
    print(f"== {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.perf_counter()
        wait_for_health(url, 600, proc)
        res = {"start_s": time.perf_counter() - t0, **measure(url, f"[{name} {time.time():.0f}]", sessions)}
        res["load_1min"] = os.getloadavg()[0]
        res["peak_rss_mb"] = peak_rss_mb(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(f"   {json.dumps({k: round(v, 1) for k, v in res.items()})}", file=sys.stderr, flush=True)
    return res


def main() -> None:
    cache = Path(os.environ.get("AGENTSERVE_CACHE_DIR", Path.home() / ".cache" / "agentserve"))
    default_server = cache / "llamacpp-0.3.36" / "tools-build" / "bin" / "llama-server"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(embedded_gguf()))
    ap.add_argument("--llama-server", default=str(default_server))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--ctx", type=int, default=8192, help="context window of both servers")
    ap.add_argument("--hf", action="store_true", help="also agentserve's hf engine (fp32)")
    ap.add_argument("--no-llama-server", action="store_true", help="leave llama-server out")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each arm, alternating (medians)")
    ap.add_argument("--replay-sessions", type=int, default=4, help="agent sessions replayed (0: no replay)")
    ap.add_argument("--replay-context", type=int, default=4096, help="the replay's sessions fit this window")
    ap.add_argument("--replay-steps", type=int, default=50, help="tool steps a replayed session at most")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "llamacpp"))
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    model = "embedded" if args.model == str(embedded_gguf()) else args.model
    sessions = generate_sessions(
        7, args.replay_sessions, context=args.replay_context, steps=args.replay_steps
    )
    arms: list[tuple[str, list[str], dict[str, str]]] = []
    for name, engine in [("agentserve llamacpp", "llamacpp")] + (
        [("agentserve hf", "hf")] if args.hf else []
    ):
        cmd = [sys.executable, "-m", "server.cli", "serve", "--model", model, "--engine", engine]
        arm_env = {**env, "AGENTSERVE_MAX_MODEL_LEN": str(args.ctx), "AGENTSERVE_THREADS": str(args.threads)}
        arms.append((name, cmd + ["--port"], arm_env))
    if args.no_llama_server:
        pass
    elif Path(args.llama_server).is_file():
        cmd = [args.llama_server, "-m", args.model, "-t", str(args.threads), "-tb", str(args.threads)]
        cmd += ["-np", "8", "-c", str(2 * args.ctx), "--kv-unified", "--no-webui", "--jinja", "--port"]
        arms.append(("llama-server", cmd, env))
    else:
        print(f"no llama-server at {args.llama_server}: scripts/install_llamacpp.sh --tools", file=sys.stderr)
    each: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in arms}
    for _ in range(args.repeat):
        for name, cmd, arm_env in arms:
            port = free_port()
            each[name].append(run_server(name, cmd + [str(port)], arm_env, port, sessions))
    runs = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in each.items()}
    write(args, runs, each)


def write(
    args: argparse.Namespace, runs: dict[str, dict[str, float]], each: dict[str, list[dict[str, float]]]
) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    meta = {
        "model": Path(args.model).name,
        "threads": args.threads,
        "ctx": args.ctx,
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "commit": commit.stdout.strip(),
        "command": " ".join(sys.argv),
        "repeat": args.repeat,
    }
    doc = {"meta": meta, "runs": runs, "each": each}
    Path(args.out + ".json").write_text(json.dumps(doc, indent=2) + "\n")
    rows = [
        ("1 session decode (tok/s)", "decode_1_tok_s"),
        ("8 sessions, shared ~600-token prefix (aggregate tok/s)", "shared_8_tok_s"),
        ("cold prefill (prompt tok/s)", "prefill_tok_s"),
        ("cold prefill prompt (tokens)", "prefill_tokens"),
        ("agent replay wall time (s)", "replay_wall_s"),
        ("agent replay prompt tokens cached (%)", "replay_hit_pct"),
        ("agent replay turns", "replay_turns"),
        ("agent replay prompt tokens", "replay_prompt_tokens"),
        ("peak resident memory (MB)", "peak_rss_mb"),
        ("start (s)", "start_s"),
    ]
    names = list(runs)
    lines = [f"# llamacpp engine vs llama-server: {meta['model']}", ""]
    lines += ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, key in rows:
        lines.append(
            f"| {label} | " + " | ".join(f"{runs[n].get(key, float('nan')):.1f}" for n in names) + " |"
        )
    if "llama-server" in runs:  # each figure over llama-server's (wall time and memory: lower is better)
        lines += ["", "Against llama-server (ours / theirs):", ""]
        for label, key in rows[:3] + [rows[4], rows[-2]]:
            peer = runs["llama-server"].get(key, float("nan"))
            ours = [n for n in names if n != "llama-server"]
            lines.append(f"- {label}: " + ", ".join(f"{n} {runs[n].get(key, 0) / peer:.2f}x" for n in ours))
    loads = [round(r["load_1min"], 1) for rs in each.values() for r in rs]
    lines += [
        "",
        f"`{meta['command']}` at {meta['commit']}, {meta['machine']}, {args.threads} threads; "
        f"medians of {args.repeat} alternating run(s) per arm; 1-min load average at each run's end {loads}.",
    ]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
