"""What every HTTP comparison shares: arms, servers, sessions, the replay of arms, the report.

An ``Arm`` is one side of a comparison (label + request layout + server + turns).
``run_arms`` replays the same sessions under each arm and returns one record per request;
``finish`` writes the results (``report.save``) with the run's meta (model, server, exact
command, notes). Each comparison module in ``benchmarks/compare/`` builds its arms and
calls these.
"""

from __future__ import annotations

import argparse
import os
import shlex
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import report
from benchmarks.harness.runner import Job, run_jobs_sync
from benchmarks.harness.trace_gen import Session, generate_sessions
from benchmarks.harness.variants import RequestSpec, build_requests


@dataclass
class Arm:
    """One side of a comparison: a label, a request layout, a server, and which turns to send."""

    label: str
    variant: str
    server: dict[str, Any] = field(default_factory=lambda: {"kind": "local"})
    turns: set[int] | None = None


# -- servers -----------------------------------------------------------------------------
def server_overrides(args: argparse.Namespace) -> dict[str, Any]:
    out = {k: v for k, v in {"model": args.model, "device": args.device, "engine": args.engine}.items() if v}
    if args.threads:
        out["threads"] = args.threads
    if args.random_model:
        from benchmarks.harness.inproc import save_random_model
        from benchmarks.harness.tokens import load_tokenizer

        cache = Path(os.environ.get("AGENTSERVE_CACHE_DIR", Path.home() / ".cache" / "agentserve"))
        folder = cache / "bench-models" / f"random-{args.random_model}"
        out["model"] = str(save_random_model(args.random_model, load_tokenizer(args.tokenizer), folder))
        out["served_model_name"] = f"RANDOM-WEIGHT-{args.random_model}"
    return out


def open_server(spec: dict[str, Any], args: argparse.Namespace):
    from benchmarks.harness import servers

    if spec["kind"] == "url":
        return nullcontext(spec["url"])
    if spec["kind"] == "cluster":
        return servers.cluster_server(spec["workers"], spec["policy"])
    overrides = server_overrides(args)
    if spec.get("cache") is False:
        overrides["prefix_cache"] = {"enabled": False}
    return servers.local_server(args.config, **overrides)


def default_server(args: argparse.Namespace) -> dict[str, Any]:
    return {"kind": "url", "url": args.url} if args.url else {"kind": "local"}


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


_INFO: dict[str, dict[str, Any]] = {}


def server_info(url: str) -> dict[str, Any]:
    """GET /v1/models once per URL (model name, context, engine)."""
    from benchmarks.harness.servers import server_info as fetch

    if url not in _INFO:
        _INFO[url] = fetch(url)
    return _INFO[url]


def set_info(key: str, info: dict[str, Any]) -> None:
    _INFO[key] = info


# -- sessions ------------------------------------------------------------------------------
def make_sessions(args: argparse.Namespace, n: int | None = None) -> list[Session]:
    """The seeded synthetic agent sessions, sized with the embedded tokenizer and template."""
    from benchmarks.harness.tokens import load_tokenizer, prompt_counter, token_counter

    tok = load_tokenizer(args.tokenizer)
    return generate_sessions(
        args.seed,
        n or args.sessions,
        context=args.context or 8192,
        steps=args.steps,
        reserve=max(256, args.max_tokens + 64),
        count_tokens=token_counter(tok),
        prompt_tokens=prompt_counter(tok),
    )


def swe_sessions(args: argparse.Namespace) -> list[Session]:
    """The SWE-agent replays, cut to the context with the embedded tokenizer and template."""
    from benchmarks.harness.swe_traces import load_traces
    from benchmarks.harness.tokens import load_tokenizer, prompt_counter

    tok = load_tokenizer(args.tokenizer)
    return load_traces(
        context=args.context or 8192,
        reserve=max(256, args.max_tokens + 64),
        max_obs_chars=args.max_obs_chars,
        prompt_tokens=prompt_counter(tok),
    )


def limit_turns(requests: list[RequestSpec], max_turns: int | None) -> list[RequestSpec]:
    return [r for r in requests if max_turns is None or r.turn <= max_turns]


def tag(spec: RequestSpec, text: str) -> RequestSpec:
    """Prefix the first user message with ``text`` (so arms on one server share no conversation)."""
    msgs = [dict(m) for m in spec.body["messages"]]
    for m in msgs:
        if m["role"] == "user":
            m["content"] = f"{text} {m['content']}"
            break
    return RequestSpec(spec.turn, {**spec.body, "messages": msgs})


def arm_jobs(
    arm: Arm, sessions: list[Session], args: argparse.Namespace, run_id: str, shared: bool
) -> list[Job]:
    jobs = []
    for s in sessions:
        reqs = limit_turns(build_requests(s, arm.variant), args.max_turns)
        if shared:
            reqs = [tag(r, f"[bench {run_id} {arm.label}]") for r in reqs]
        key = f"bench-{run_id}-{arm.label}-{s.session_id}".replace(" ", "_")
        jobs.append(Job(arm.label, s, reqs, key))
    return jobs


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
            info = server_info(url)
            for arm in group:
                records += run_jobs_sync(
                    url,
                    arm_jobs(arm, sessions, args, run_id, shared),
                    model=args.served_model or info["model"],
                    turns=arm.turns,
                    concurrency=args.concurrency,
                    max_tokens=args.max_tokens,
                    progress=not args.quiet,
                )
        i += len(group)
    return records


# -- results -------------------------------------------------------------------------------
def command_line(args: argparse.Namespace) -> str:
    return "agentserve bench " + " ".join(shlex.quote(a) for a in args.argv)


def meta(args: argparse.Namespace, sessions: list[Session], notes: list[str] | None = None) -> dict[str, Any]:
    info = next(iter(_INFO.values()), {})
    server = f"{args.url} (external)" if args.url else "in-process agentserve (hf engine), loopback HTTP"
    if args.comparison == "inproc":
        server = "none: the engine in-process, no HTTP"
    return {
        "model": f"{info.get('model', '?')} (context {info.get('max_model_len', '?')}, "
        f"engine {info.get('engine', '?')})",
        "server": server,
        "command": command_line(args),
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


def ratio_line(rows: list[dict[str, Any]], a: str, b: str, at: int) -> str | None:
    ra = next((r for r in rows if r["label"] == a), None)
    rb = next((r for r in rows if r["label"] == b), None)
    key = f"ttft_turn{at}_s"
    if not ra or not rb or not ra.get(key) or not rb.get(key):
        return None
    return (
        f"**TTFT at turn {at}: {b} {rb[key]:.3f} s vs {a} {ra[key]:.3f} s -> "
        f"{a} is 1/{rb[key] / ra[key]:.1f} of {b}** (goal: at most 1/10)"
    )


def finish(
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
        meta(args, sessions, notes),
        at_turn=args.at_turn,
        extra_lines=extra,
        out_dir=Path(args.out),
        plots=not args.no_plots,
        ttft_plot=not args.random_model,  # a random-weight model's TTFT says nothing
    )
    print(out["markdown"])
