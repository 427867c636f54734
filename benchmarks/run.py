"""agentserve bench: TTFT and cache hit rate on agent traces, each comparison side by side in one run.

Comparisons (each writes benchmarks/results/<name>.{json,md} + <name>_ttft.png, <name>_hit.png):

  cache      prefix cache on vs off (good practice; cache-off only on --off-turns, it is slow)
  variants   good practice vs each way of breaking the cache (timestamp, shuffled keys, edited
             observation, tools removed) -- a fresh in-process server per variant
  tools      mask (allowed_tools, tools kept) vs remove (tools deleted) vs keep (no restriction)
  swe        the real SWE-agent traces: good, cache off, timestamp, shuffled keys, edited observation
  routing    affinity vs round_robin vs least_loaded with --workers N (needs server.routing)
  inproc     no HTTP: the engine's prefill on each turn, cache on vs off (embedded model or --shape)
  gpu-ttft   no HTTP: TTFT vs context (2k-32k) cached vs uncached, RANDOM-WEIGHT --shapes
  all        cache, variants, tools, swe (+ routing when available)

Servers: in-process on a loopback port by default (the embedded model, or --model /
--device / --config as for ``agentserve serve``); ``--url`` for a running server
(``--url-off`` for the cache-off side of ``cache``/``swe``).

Examples:
  agentserve bench cache --sessions 1
  agentserve bench variants --max-turns 20
  agentserve bench gpu-ttft --shapes llama-1b,llama-8b --device cuda
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks import report  # noqa: E402
from benchmarks.runner import Job, run_jobs_sync  # noqa: E402
from benchmarks.trace_gen import Session, generate_sessions  # noqa: E402
from benchmarks.variants import VARIANTS, build_requests  # noqa: E402

DEFAULT_VARIANTS = ("good", "timestamp", "shuffled_keys", "edited_observation", "tools_remove")


@dataclass
class Arm:
    """One side of a comparison: a label, a request layout, a server, and which turns to send."""

    label: str
    variant: str
    server: dict[str, Any] = field(default_factory=lambda: {"kind": "local"})
    turns: set[int] | None = None


# -- servers -----------------------------------------------------------------------------
def _server_overrides(args: argparse.Namespace) -> dict[str, Any]:
    out = {k: v for k, v in {"model": args.model, "device": args.device, "engine": args.engine}.items() if v}
    if args.threads:
        out["threads"] = args.threads
    if args.random_model:
        from benchmarks.inproc import save_random_model
        from benchmarks.tokens import load_tokenizer

        cache = Path(os.environ.get("AGENTSERVE_CACHE_DIR", Path.home() / ".cache" / "agentserve"))
        folder = cache / "bench-models" / f"random-{args.random_model}"
        out["model"] = str(save_random_model(args.random_model, load_tokenizer(args.tokenizer), folder))
        out["served_model_name"] = f"RANDOM-WEIGHT-{args.random_model}"
    return out


def open_server(spec: dict[str, Any], args: argparse.Namespace):
    from benchmarks import servers

    if spec["kind"] == "url":
        return nullcontext(spec["url"])
    if spec["kind"] == "cluster":
        return servers.cluster_server(spec["workers"], spec["policy"])
    overrides = _server_overrides(args)
    if spec.get("cache") is False:
        overrides["prefix_cache"] = {"enabled": False}
    return servers.local_server(args.config, **overrides)


def cache_server(args: argparse.Namespace, on: bool) -> dict[str, Any]:
    if args.url:
        if on:
            return {"kind": "url", "url": args.url}
        if not args.url_off:
            raise SystemExit(
                "with --url, the cache-off side needs --url-off (a server with prefix_cache.enabled=false)"
            )
        return {"kind": "url", "url": args.url_off}
    return {"kind": "local", "cache": on}


# -- sessions ------------------------------------------------------------------------------
def make_sessions(args: argparse.Namespace, n: int | None = None) -> list[Session]:
    from benchmarks.tokens import load_tokenizer, prompt_counter, token_counter

    tok = load_tokenizer(args.tokenizer)
    context = args.context or 8192
    return generate_sessions(
        args.seed,
        n or args.sessions,
        context=context,
        steps=args.steps,
        reserve=max(256, args.max_tokens + 64),
        count_tokens=token_counter(tok),
        prompt_tokens=prompt_counter(tok),
    )


def swe_sessions(args: argparse.Namespace) -> list[Session]:
    from benchmarks.swe_traces import load_traces
    from benchmarks.tokens import load_tokenizer, prompt_counter

    tok = load_tokenizer(args.tokenizer)
    return load_traces(
        context=args.context or 8192,
        reserve=max(256, args.max_tokens + 64),
        max_obs_chars=args.max_obs_chars,
        prompt_tokens=prompt_counter(tok),
    )


def _limit(requests: list, max_turns: int | None) -> list:
    return [r for r in requests if max_turns is None or r.turn <= max_turns]


def run_arms(arms: list[Arm], sessions: list[Session], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the arms in order. Arms on one server (a --url, or any with --shared-server) share it:
    their sessions get a per-arm tag in the first user message so no arm reuses another's
    conversation (the system prompt + tools before it are shared, as across real sessions)."""
    run_id = uuid.uuid4().hex[:8]
    records: list[dict[str, Any]] = []
    i = 0
    while i < len(arms):
        group = [arms[i]]
        if args.shared_server or arms[i].server["kind"] == "url":
            while i + len(group) < len(arms) and arms[i + len(group)].server == arms[i].server:
                group.append(arms[i + len(group)])
        shared = len(group) > 1 or arms[i].server["kind"] == "url"
        with open_server(group[0].server, args) as url:
            info = _server_info(url)
            for arm in group:
                jobs = []
                for s in sessions:
                    reqs = _limit(build_requests(s, arm.variant), args.max_turns)
                    if shared:
                        reqs = [_tag(r, f"[bench {run_id} {arm.label}]") for r in reqs]
                    key = f"bench-{run_id}-{arm.label}-{s.session_id}".replace(" ", "_")
                    jobs.append(Job(arm.label, s, reqs, key))
                records += run_jobs_sync(
                    url,
                    jobs,
                    model=args.served_model or info["model"],
                    turns=arm.turns,
                    concurrency=args.concurrency,
                    max_tokens=args.max_tokens,
                    progress=not args.quiet,
                )
        i += len(group)
    return records


def _tag(spec, tag: str):
    from benchmarks.variants import RequestSpec

    msgs = [dict(m) for m in spec.body["messages"]]
    for m in msgs:
        if m["role"] == "user":
            m["content"] = f"{tag} {m['content']}"
            break
    return RequestSpec(spec.turn, {**spec.body, "messages": msgs})


_INFO: dict[str, dict[str, Any]] = {}


def _server_info(url: str) -> dict[str, Any]:
    from benchmarks.servers import server_info

    if url not in _INFO:
        _INFO[url] = server_info(url)
    return _INFO[url]


def _meta(
    args: argparse.Namespace, sessions: list[Session], notes: list[str] | None = None
) -> dict[str, Any]:
    info = next(iter(_INFO.values()), {})
    server = f"{args.url} (external)" if args.url else "in-process agentserve (hf engine), loopback HTTP"
    if args.comparison == "inproc":
        server = "none: the engine in-process, no HTTP"
    return {
        "model": f"{info.get('model', '?')} (context {info.get('max_model_len', '?')}, "
        f"engine {info.get('engine', '?')})",
        "server": server,
        "command": "agentserve bench " + " ".join(shlex.quote(a) for a in args.argv),
        "notes": (notes or [])
        + [f"session {s.session_id}: {s.notes}" for s in sessions[:4]]
        + (
            ["one server for all arms; each arm's sessions tagged in the first user message"]
            if args.shared_server
            else []
        )
        + [
            f"settings: seed {args.seed}, sessions {len(sessions)}, concurrency {args.concurrency}, "
            f"max_tokens {args.max_tokens}, max_turns {args.max_turns or 'all'}, "
            f"torch threads {args.threads or 'default'}"
        ],
    }


def _ratio_line(rows: list[dict[str, Any]], a: str, b: str, at: int) -> str | None:
    ra = next((r for r in rows if r["label"] == a), None)
    rb = next((r for r in rows if r["label"] == b), None)
    key = f"ttft_turn{at}_s"
    if not ra or not rb or not ra.get(key) or not rb.get(key):
        return None
    return (
        f"**TTFT at turn {at}: {b} {rb[key]:.3f} s vs {a} {ra[key]:.3f} s -> "
        f"{a} is 1/{rb[key] / ra[key]:.1f} of {b}** (goal: at most 1/10)"
    )


def _finish(
    name: str,
    title: str,
    records: list[dict[str, Any]],
    args: argparse.Namespace,
    sessions: list[Session],
    notes: list[str] | None = None,
    extra: list[str] | None = None,
) -> None:
    out = report.save(
        name,
        title,
        records,
        _meta(args, sessions, notes),
        at_turn=args.at_turn,
        extra_lines=extra,
        out_dir=Path(args.out),
        plots=not args.no_plots,
        ttft_plot=not args.random_model,  # a random-weight model's TTFT says nothing
    )
    print(out["markdown"])


# -- comparisons ---------------------------------------------------------------------------
def cmd_cache(args: argparse.Namespace) -> None:
    sessions = make_sessions(args)
    n_turns = max(len(s.turns) for s in sessions)
    off_turns = {int(t) for t in args.off_turns.split(",") if int(t) <= n_turns}
    arms = [
        Arm("cache on", "good", cache_server(args, True)),
        Arm("cache off", "good", cache_server(args, False), off_turns),
    ]
    records = run_arms(arms, sessions, args)
    rows = report.summarize(records, args.at_turn)
    extra = [line for line in [_ratio_line(rows, "cache on", "cache off", args.at_turn)] if line]
    _finish(
        args.name or "cache_on_off",
        "Prefix cache on vs off (good practice)",
        records,
        args,
        sessions,
        [f"cache off is measured on turns {sorted(off_turns)} only (every turn is a full prefill there)"],
        extra,
    )


def _mask_supported(args: argparse.Namespace) -> bool:
    """True when the server enforces allowed_tools (tool_state in the reply names only the subset)."""
    import httpx

    from benchmarks.agent_tools import agent_tools
    from benchmarks.variants import allowed_tools_choice

    spec = {"kind": "url", "url": args.url} if args.url else {"kind": "local"}
    with open_server(spec, args) as url:
        info = _server_info(url)
        body = {
            "model": args.served_model or info["model"],
            "max_tokens": 1,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Open the docs."}],
            "tools": agent_tools(),
            "tool_choice": allowed_tools_choice("browser_"),
        }
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
        allowed = (r.json().get("tool_state") or {}).get("allowed") if r.status_code == 200 else None
    return bool(allowed) and all(n.startswith("browser_") for n in allowed)


def cmd_variants(args: argparse.Namespace) -> None:
    names = args.variants.split(",") if args.variants else list(DEFAULT_VARIANTS)
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variant(s) {bad}: choose from {', '.join(VARIANTS)}")
    sessions = make_sessions(args)
    arms = [Arm(v, v, {"kind": "url", "url": args.url} if args.url else {"kind": "local"}) for v in names]
    records = run_arms(arms, sessions, args)
    rows = report.summarize(records, args.at_turn)
    good = next((r for r in rows if r["label"] == "good"), None)
    extra = []
    if good and good["hit_rate"]:
        extra = ["| variant | hit rate ÷ good's | TTFT median ÷ good's |", "|---|---|---|"]
        for r in rows:
            hr = f"{r['hit_rate'] / good['hit_rate']:.2f}" if r["hit_rate"] is not None else "—"
            tt = f"{r['ttft_median_s'] / good['ttft_median_s']:.1f}×" if r["ttft_median_s"] else "—"
            extra.append(f"| {r['label']} | {hr} | {tt} |")
    _finish(
        args.name or "variants",
        "Good practice vs cache-breaking variants",
        records,
        args,
        sessions,
        [
            "shuffled_keys: agentserve renders tool-call arguments canonically (sorted keys), so shuffled "
            "key order is expected NOT to break its cache"
        ],
        extra,
    )


def cmd_tools(args: argparse.Namespace) -> None:
    supported = _mask_supported(args)
    names = (["tools_mask"] if supported else []) + ["tools_remove", "tools_keep"]
    note = (
        "tools_mask: all tools sent, the phase enforced with tool_choice allowed_tools (name_prefix)"
        if supported
        else "tools_mask NOT measured: this server does not enforce tool_choice allowed_tools yet "
        "(masking branch not merged); tools_keep (all tools, unrestricted) stands in: its prompt is the "
        "one tools_mask sends"
    )
    sessions = make_sessions(args)
    arms = [Arm(v, v, {"kind": "url", "url": args.url} if args.url else {"kind": "local"}) for v in names]
    records = run_arms(arms, sessions, args)
    _finish(
        args.name or "tools_mask_remove",
        "Tool list changed mid-session: mask vs remove",
        records,
        args,
        sessions,
        [note],
    )


def cmd_swe(args: argparse.Namespace) -> None:
    sessions = swe_sessions(args)
    n_turns = min(len(s.turns) for s in sessions)
    if args.at_turn > n_turns:
        args.at_turn = n_turns  # the traces are short: report the last turn they all have
    off_turns = {int(t) for t in args.off_turns.split(",") if int(t) <= n_turns} | {args.at_turn}
    local = {"kind": "url", "url": args.url} if args.url else {"kind": "local"}
    arms = [
        Arm("good", "good", local),
        Arm("cache off", "good", cache_server(args, False), off_turns),
        Arm("timestamp", "timestamp", local),
        Arm("shuffled_keys", "shuffled_keys", local),
        Arm("edited_observation", "edited_observation", local),
    ]
    if args.variants:  # a subset of the arms, by label
        keep = set(args.variants.split(","))
        arms = [a for a in arms if a.label in keep]
    records = run_arms(arms, sessions, args)
    rows = report.summarize(records, args.at_turn)
    extra = [line for line in [_ratio_line(rows, "good", "cache off", args.at_turn)] if line]
    _finish(
        args.name or "swe_agent",
        "Real SWE-agent traces (marshmallow-1867)",
        records,
        args,
        sessions,
        [
            "edited_observation edits every 10th turn; these traces have 10-11 turns",
            f"cache off is measured on turns {sorted(off_turns)} only",
        ],
        extra,
    )


def cmd_routing(args: argparse.Namespace) -> None:
    from benchmarks.servers import routing_available

    if not routing_available():
        raise SystemExit(
            "routing comparison: server.routing is not on this branch yet (merge main after the "
            "routing branch lands); the code path is ready: agentserve bench routing --workers 3"
        )
    if args.sessions == 1:  # routing needs several sessions in flight to mean anything
        args.sessions = 2 * args.workers
    if args.concurrency == 1:
        args.concurrency = args.workers
    sessions = make_sessions(args)
    arms = [
        Arm(p, "good", {"kind": "cluster", "workers": args.workers, "policy": p})
        for p in args.policies.split(",")
    ]
    records = run_arms(arms, sessions, args)
    _finish(
        args.name or "routing",
        f"Routing policies with {args.workers} workers",
        records,
        args,
        sessions,
        [
            f"{args.workers} worker processes behind the router (agentserve serve --workers {args.workers}); "
            f"{args.concurrency} sessions at a time"
        ],
    )


def _engine_and_label(args: argparse.Namespace, cache: bool):
    from benchmarks.inproc import engine_for, random_model
    from benchmarks.tokens import load_tokenizer

    if args.shape:
        import torch

        tok = load_tokenizer(args.tokenizer)
        dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = random_model(
            args.shape, len(tok), device=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32
        )
        return engine_for(model, tok, cache=cache), f"RANDOM-WEIGHT {args.shape} shape on {dev}"
    from server.config import load_settings
    from server.engines.hf import HFEngine

    overrides = _server_overrides(args)
    settings = load_settings(args.config, prefix_cache={"enabled": cache}, **overrides)
    eng = HFEngine(settings.engine_settings())
    return eng, f"{settings.model} on {eng.device}"  # (HFEngine has no model_path)


def cmd_inproc(args: argparse.Namespace) -> None:
    from benchmarks.inproc import replay_inproc

    sessions = make_sessions(args)
    records = []
    off_turns = {int(t) for t in args.off_turns.split(",")}
    paired: list[dict[str, Any]] = []
    eng, label = _engine_and_label(args, True)
    from benchmarks.inproc import warm_up
    from benchmarks.tokens import render_ids

    first = build_requests(sessions[0], "good")[0].body
    warm_up(eng, render_ids(eng.tokenizer, first["messages"], first["tools"]))
    for cache in (True, False):
        eng.cache.clear()
        eng.cache.enabled = cache
        jobs = []
        for s in sessions:
            reqs = _limit(build_requests(s, "good"), args.max_turns)
            if not cache:
                reqs = [r for r in reqs if r.turn in off_turns]
            jobs.append(Job("cache on" if cache else "cache off", s, reqs, s.session_id))
        recs, pairs = replay_inproc(
            eng,
            jobs,
            progress=not args.quiet,
            paired_turn=args.at_turn if cache else None,
            paired_repeats=args.repeats,
        )
        records += recs
        paired += pairs
    rows = report.summarize(records, args.at_turn)
    extra = [line for line in [_ratio_line(rows, "cache on", "cache off", args.at_turn)] if line]
    for p in paired:
        c, u = p["cached_s"], p["uncached_s"]
        extra.append(
            f"**Paired at turn {p['turn']} ({p['prompt_tokens']} prompt tokens, "
            f"{p['cached_tokens']} cached), "
            f"cached and uncached alternated {len(c)}×: cached {', '.join(f'{x:.3f}' for x in c)} s; "
            f"uncached {', '.join(f'{x:.3f}' for x in u)} s -> cached is 1/{p['ratio']:.1f} of uncached "
            f"(medians)**"
        )
    _INFO["inproc"] = {
        "model": label,
        "max_model_len": args.context or 8192,
        "engine": "hf, in-process, no HTTP",
    }
    _finish(
        args.name or "inproc_cache_on_off",
        f"In-process prefill TTFT, cache on/off: {label}",
        records,
        args,
        sessions,
        ["TTFT here = engine prefill to the first logits (no HTTP, no tokenizing, no decode)"],
        extra,
    )


def cmd_gpu_ttft(args: argparse.Namespace) -> None:
    import json

    import torch

    from benchmarks.inproc import context_sweep, plot_sweep, random_model
    from benchmarks.tokens import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    contexts = [int(c) for c in args.contexts.split(",")]
    rows = []
    chunks: list[int | None] = (
        [int(c) for c in args.prefill_chunks.split(",")] if args.prefill_chunks else [None]
    )
    for shape in args.shapes.split(","):
        t0 = time.perf_counter()
        model = random_model(
            shape, len(tok), device=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32
        )
        print(f"{shape}: built in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        for chunk in chunks:
            rows += context_sweep(
                model,
                tok,
                contexts,
                new_tokens=args.new_tokens,
                repeats=args.repeats,
                label=shape if len(chunks) == 1 else f"{shape} chunk {chunk}",
                progress=not args.quiet,
                prefill_chunk=chunk,
            )
        del model
        if dev == "cuda":
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or "gpu_ttft_context"
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": report.machine(),
        "commit": report.git_commit(),
        "command": "agentserve bench " + " ".join(shlex.quote(a) for a in args.argv),
        "model": f"RANDOM-WEIGHT Llama shapes {args.shapes} "
        f"({'bf16' if dev == 'cuda' else 'fp32'} on {dev}), "
        f"embedded SmolLM2 tokenizer/vocab "
        f"({len(tok)}); hf engine prefill + prefix cache (block 32), in-process, no HTTP",
    }
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = ["# TTFT vs context, cached vs uncached — RANDOM-WEIGHT models", ""]
    lines += [f"- **{k}**: {v}" for k, v in meta.items()]
    lines += [
        f"- TTFT = the engine's prefill of context + {args.new_tokens} new tokens to the first logits; "
        f"uncached = prefix cache off; cached = the context was prefilled before (cache on); median of "
        f"{args.repeats}; 'cold fill' = first prefill of the context with the cache on "
        "(includes storing the blocks)",
        "",
        "| shape | context | uncached (ms) | cached (ms) | speedup | cold fill (ms) | cached tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['context']} | {1000 * r['uncached_s']:.1f} | {1000 * r['cached_s']:.1f} | "
            f"{r['speedup']:.1f}× | {1000 * r['cold_fill_s']:.1f} | {r['cached_tokens']} |"
        )
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    if not args.no_plots:
        plot_sweep(rows, str(out / f"{name}.png"), f"TTFT vs context, RANDOM-WEIGHT {args.shapes}, {dev}")
    print("\n".join(lines))


def cmd_all(args: argparse.Namespace) -> None:
    from benchmarks.servers import routing_available

    for fn in (cmd_cache, cmd_variants, cmd_tools, cmd_swe):
        fn(args)
    if routing_available():
        cmd_routing(args)
    else:
        print("routing: skipped (server.routing not on this branch yet)", file=sys.stderr)


COMMANDS = {
    "cache": cmd_cache,
    "variants": cmd_variants,
    "tools": cmd_tools,
    "swe": cmd_swe,
    "routing": cmd_routing,
    "inproc": cmd_inproc,
    "gpu-ttft": cmd_gpu_ttft,
    "all": cmd_all,
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="agentserve bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("comparison", choices=list(COMMANDS))
    g = ap.add_argument_group("server")
    g.add_argument("--url", help="a running server (default: start one in-process on a loopback port)")
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
    args = parser().parse_args(argv)
    args.argv = argv
    COMMANDS[args.comparison](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
