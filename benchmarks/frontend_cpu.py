"""CPU time of each process of a server (API front end, vLLM engine core, worker), per request and per token.

Starts each built-in peer of ``bench peers`` in turn (``benchmarks/peers.py``: stock vLLM,
agentserve on the vLLM engine, agentserve on the hf engine) and sends it

1. ``--requests`` requests of one output token on a ~4k-token prompt with the SWE-agent tools,
   the prefix cached (the cost of taking a request in: render, tokenize, plan, schedule), then
2. ``--long`` requests of up to ``--tokens`` tokens (the cost per generated token: streaming,
   detokenizing, the tool-call watcher),

and prints, per request, the wall time and the CPU milliseconds of every process of the server
(``/proc`` via psutil: 10 ms resolution, so per-request figures under 10 ms read 0). CPU time
survives a busy machine better than wall time does.

    python benchmarks/frontend_cpu.py                       # vllm, agentserve-vllm
    python benchmarks/frontend_cpu.py agentserve-hf --requests 6
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psutil  # noqa: E402

from benchmarks.peers import builtin_peer, running  # noqa: E402


def server_processes(url: str) -> list[psutil.Process]:
    """The process listening on ``url``'s port (found by its command line) and all its children."""
    port = url.rsplit(":", 1)[1]
    roots = [
        p
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and "--port" in p.info["cmdline"] and port in p.info["cmdline"]
    ]
    return [q for p in roots for q in [p, *p.children(recursive=True)]]


def cpu_ms(procs: list[psutil.Process]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in procs:
        try:
            t = p.cpu_times()
            name = "api" if not p.parents() or p.name().startswith("python") else p.name()
            out[f"{name}:{p.pid}"] = (t.user + t.system) * 1000
        except psutil.NoSuchProcess:
            pass
    return out


def timed(url: str, body: dict[str, Any], procs: list[psutil.Process]) -> tuple[float, int, dict[str, float]]:
    before = cpu_ms(procs)
    t0 = time.perf_counter()
    tokens = 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                tokens = usage["completion_tokens"] if usage else tokens
    wall = time.perf_counter() - t0
    after = cpu_ms(procs)
    return wall, tokens, {k: after[k] - before[k] for k in after if k in before}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("servers", nargs="*", default=["vllm", "agentserve-vllm"])
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--long", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args()
    from server.model_store import resolve_model

    tools = json.loads((ROOT / "tests" / "fixtures" / "swe_agent_tools.json").read_text())
    tools = tools if isinstance(tools, list) else tools["tools"]
    system = "You are a coding agent working in a repository. " + " ".join(
        f"Rule {i}: read files before editing them and run the tests after each change." for i in range(80)
    )
    model_dir = resolve_model("embedded")
    for name in args.servers:
        with running(builtin_peer(name, model_dir, 2, 8192)) as url:
            model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
            procs = server_processes(url)
            base = {"model": model, "tools": tools, "temperature": 0, "stream": True}
            base["stream_options"] = {"include_usage": True}
            for i in range(args.requests + 2):  # the first two warm up
                user = f"Task {i}: fix the failing test in module {i}."
                msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
                wall, _, cpu = timed(url, {**base, "messages": msgs, "max_tokens": 1}, procs)
                if i >= 2:
                    shown = {k: round(v) for k, v in sorted(cpu.items())}
                    print(f"{name} 1-token request: wall {wall * 1000:.0f} ms, CPU ms {shown}", flush=True)
            for _ in range(args.long):
                user = "Write the numbers from 1 to 300, separated by commas, and nothing else."
                msgs = [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": user},
                ]
                wall, n, cpu = timed(url, {**base, "messages": msgs, "max_tokens": args.tokens}, procs)
                per = {k: round(v / max(1, n), 2) for k, v in sorted(cpu.items())}
                print(f"{name} {n}-token reply: wall {wall:.1f} s, CPU ms per token {per}", flush=True)


if __name__ == "__main__":
    main()
