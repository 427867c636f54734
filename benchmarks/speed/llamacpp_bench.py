"""agentserve's llamacpp engine vs llama.cpp's own llama-server on the same GGUF, side by side.

    python benchmarks/speed/llamacpp_bench.py [--model FILE.gguf] [--llama-server PATH] [--hf] [--threads 2]
        [--ctx 8192] [--repeat N] [--replay-sessions 4] [--replay-context 4096] [--out STEM]

Every server runs as its own process, all of them up at once, with the same GGUF, threads and
requests (OpenAI chat completions over HTTP, temperature 0): one-session decode (tok/s between
a 1-token and a 64-token reply on a cached prompt), 8 concurrent sessions sharing a ~600-token
system prompt (aggregate generated tok/s, wall clock), a cold ~4k-token prefill (prompt tok/s),
an agent replay (the seeded synthetic agent sessions of ``benchmarks/harness/trace_gen.py``, one
session after another, every turn's prompt the trace's own history with its tools, rendered once
by agentserve's ``/tokenize`` and sent to every server as the same token ids, an 8-token reply:
wall time and the share of prompt tokens the server reports cached), and the
process's peak resident memory (VmHWM). Each row's sample goes to every server back to back,
the order alternating from one sample to the next (``--repeat N`` samples of the decode, 8-session
and prefill rows; the replay turn by turn), so the two arms of a pair see the same moment of the
box's load: a rate's ratio is the median of its pairs' ratios, the replay's the ratio of its walls
(each turn's ratio listed beside it; the box is shared: compare within one run). ``--hf`` adds
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
import tempfile
import time
from collections.abc import Callable
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


def tokenize_turns(url: str, sessions: list[Session]) -> None:
    """Every turn's prompt as token ids (``PROMPTS``), from the first arm's ``/tokenize``, once: every
    server then gets the same ids (a GGUF's own template may leave the tools out)."""
    if PROMPTS:
        return
    for s in sessions:
        for turn in s.turns:
            body: dict[str, Any] = {"model": MODEL["name"], "messages": s.messages[: turn.end]}
            body["tools"] = s.tools
            r = httpx.post(url + "/tokenize", json=body, timeout=600)
            r.raise_for_status()
            PROMPTS.append(r.json()["tokens"])


def replay_turn(url: str, ids: list[int]) -> tuple[float, int, int]:
    """One turn (``/v1/completions`` on the token ids): its wall time, prompt tokens, cached tokens."""
    body = {"model": MODEL["name"], "prompt": ids, "max_tokens": 8, "temperature": 0.0}
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    usage = r.json()["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return time.perf_counter() - t0, usage["prompt_tokens"], cached


def replay(servers: list[Server], sessions: list[Session]) -> None:
    """The agent sessions one after another, each turn's prompt the trace's history; each turn sent
    to every server back to back (the order alternating from turn to turn), so a turn's arms see one
    moment of the box's load. An arm's wall time: the sum of its turns."""
    MODEL["name"] = servers[0].model
    tokenize_turns(servers[0].url, sessions)
    wall = dict.fromkeys((s.name for s in servers), 0.0)
    prompt = dict.fromkeys((s.name for s in servers), 0)
    cached = dict.fromkeys((s.name for s in servers), 0)
    for i, ids in enumerate(PROMPTS):
        for server in servers if i % 2 == 0 else servers[::-1]:
            MODEL["name"] = server.model
            dt, n, hit = replay_turn(server.url, ids)
            server.add({"replay_turn_s": dt})
            wall[server.name] += dt
            prompt[server.name] += n
            cached[server.name] += hit
            time.sleep(0.5)  # the last arm's threads go idle before the next one starts
    for server in servers:
        server.add(
            {
                "replay_wall_s": wall[server.name],
                "replay_hit_pct": 100.0 * cached[server.name] / max(prompt[server.name], 1),
                "replay_turns": len(PROMPTS),
                "replay_prompt_tokens": prompt[server.name],
                "load_1min": os.getloadavg()[0],
            }
        )


def decode_tok_s(url: str, msgs: list[dict[str, str]]) -> float:
    """Decode rate on a cached prompt: the time of a 64-token reply less a 1-token one."""
    t1, _ = chat(url, msgs, 1)
    tn, usage = chat(url, msgs, 64)
    return float((usage["completion_tokens"] - 1) / max(tn - t1, 1e-9))


def shared_8(url: str, nonce: str) -> dict[str, float]:
    """8 sessions sharing a system prompt: the prefix computed once (warm), then 8 at once."""
    system = {"role": "system", "content": f"{nonce} {SYSTEM}"}
    chat(url, [system, {"role": "user", "content": "hi"}], 1)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(8) as pool:
        jobs = [pool.submit(chat, url, [system, {"role": "user", "content": q}], 64) for q in QUESTIONS]
        usages = [j.result()[1] for j in jobs]
    wall = time.perf_counter() - t0
    return {
        "shared_8_tok_s": sum(u["completion_tokens"] for u in usages) / wall,
        "shared_8_prompt_tokens": usages[0]["prompt_tokens"],
        "shared_8_wall_s": wall,
    }


def cold_messages(nonce: str) -> list[dict[str, str]]:
    """The cold prompt's messages: ~4k tokens, the nonce first (nothing cached)."""
    words = " ".join(f"line {i}: the job wrote {i * 7 % 97} records to shard {i % 13}." for i in range(280))
    return [{"role": "user", "content": f"cold {nonce} {words}"}]


def prefill(url: str, nonce: str) -> dict[str, float]:
    """A cold ~4k-token prompt (``cold_messages``), a 1-token reply."""
    dt, usage = chat(url, cold_messages(nonce), 1)
    return {"prefill_tokens": usage["prompt_tokens"], "prefill_tok_s": usage["prompt_tokens"] / dt}


class Server:
    """One arm's server process, up for the whole run."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        self.name = name
        port = free_port()
        # the server's log to a file: a pipe nobody reads fills and stalls a chatty server
        self.log = tempfile.NamedTemporaryFile(prefix=f"llamacpp_bench_{port}_", suffix=".log", delete=False)
        print(f"== {name} (log {self.log.name}): {' '.join(cmd)} {port}", file=sys.stderr, flush=True)
        self.proc = subprocess.Popen(cmd + [str(port)], env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        self.samples: dict[str, list[float]] = {}
        t0 = time.perf_counter()
        wait_for_health(self.url, 600, self.proc)
        self.add({"start_s": time.perf_counter() - t0})
        self.model = httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]["id"]

    def add(self, figures: dict[str, float]) -> None:
        for key, value in figures.items():
            self.samples.setdefault(key, []).append(value)

    def stop(self) -> None:
        self.add({"peak_rss_mb": peak_rss_mb(self.proc.pid)})
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def measure(servers: list[Server], repeat: int, sessions: list[Session]) -> None:
    """Every row in turn, each sample sent to every server back to back (the order alternating
    from one sample to the next), so the arms of a pair see the same moment of the box's load."""

    def each(figures: Callable[[Server, int], dict[str, float]], samples: int) -> None:
        for k in range(samples):
            for server in servers if k % 2 == 0 else servers[::-1]:
                MODEL["name"] = server.model
                server.add({**figures(server, k), "load_1min": os.getloadavg()[0]})
                time.sleep(0.5)  # the last arm's threads go idle before the next one starts

    nonce = f"[{time.time():.0f}]"  # one per run: both arms of a pair get the same prompt
    count = [{"role": "user", "content": f"{nonce} {COUNT}"}]
    for server in servers:  # warm: the prompt is cached after this
        MODEL["name"] = server.model
        chat(server.url, count, 1)
    each(lambda s, k: {"decode_1_tok_s": decode_tok_s(s.url, count)}, repeat)
    each(lambda s, k: shared_8(s.url, f"{nonce[:-1]} {k}]"), repeat)
    each(lambda s, k: prefill(s.url, f"{nonce[:-1]} {k}]"), repeat)
    if sessions:
        replay(servers, sessions)


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
    ap.add_argument("--repeat", type=int, default=1, help="samples of each rate, arms back to back")
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
    servers: list[Server] = []
    try:
        for name, cmd, arm_env in arms:
            servers.append(Server(name, cmd, arm_env))
        measure(servers, args.repeat, sessions)
    finally:
        for server in servers:
            server.stop()
    write(args, servers)


PAIRED = ("decode_1_tok_s", "shared_8_tok_s", "prefill_tok_s")  # a sample of each arm back to back


def write(args: argparse.Namespace, servers: list[Server]) -> None:
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
    runs = {s.name: {k: statistics.median(v) for k, v in s.samples.items()} for s in servers}
    peer = next((s for s in servers if s.name == "llama-server"), None)
    ratios = {  # per pair, then the median: each pair saw one moment of the box's load
        s.name: {
            k: statistics.median(a / b for a, b in zip(s.samples[k], peer.samples[k], strict=True))
            for k in PAIRED
        }
        for s in servers
        if peer is not None and s is not peer
    }
    doc = {
        "meta": meta,
        "runs": runs,
        "paired_ratios": ratios,
        "samples": {s.name: s.samples for s in servers},
    }
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
    if peer is not None:  # each figure over llama-server's (wall time and memory: lower is better)
        lines += ["", "Against llama-server (ours / theirs; a rate: the median of its pairs' ratios):", ""]
        for label, key in rows[:3] + [rows[4], rows[-2]]:
            if key not in runs[peer.name]:  # a row this run left out (--replay-sessions 0)
                continue
            parts = []
            for s in servers:
                if s is peer:
                    continue
                if key in PAIRED:
                    pairs = ", ".join(
                        f"{a / b:.2f}" for a, b in zip(s.samples[key], peer.samples[key], strict=True)
                    )
                    parts.append(f"{s.name} {ratios[s.name][key]:.2f}x (pairs {pairs})")
                elif key == "replay_wall_s" and "replay_turn_s" in s.samples:
                    turns = zip(s.samples["replay_turn_s"], peer.samples["replay_turn_s"], strict=True)
                    each_turn = ", ".join(f"{a / b:.2f}" for a, b in turns)
                    ratio = runs[s.name][key] / runs[peer.name][key]
                    parts.append(f"{s.name} {ratio:.2f}x (turns paired: {each_turn})")
                else:
                    parts.append(f"{s.name} {runs[s.name].get(key, 0) / runs[peer.name][key]:.2f}x")
            lines.append(f"- {label}: " + ", ".join(parts))
    loads = sorted({round(x, 1) for s in servers for x in s.samples.get("load_1min", [])})
    lines += [
        "",
        f"`{meta['command']}` at {meta['commit']}, {meta['machine']}, {args.threads} threads; "
        f"every server up at once, each row's {args.repeat} sample(s) and each replay turn sent to the "
        "arms back to back, the order alternating; "
        f"medians; 1-min load averages seen {loads[0] if loads else '?'}-{loads[-1] if loads else '?'}.",
    ]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
