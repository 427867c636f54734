"""``bench peers --alternate``: the servers up side by side, each turn sent to every server in turn.

Run one after another, a server's times carry whatever else the machine did while it ran:
on this shared 2-core box the same server's TTFT for the same turn swung by ±40 % between two
sequential runs, more than the differences being measured. Here all servers are started
together (same cores; each idles while another works) and the replays go turn by turn:

* session after session (one request in flight at a time), and within a session turn after
  turn; each turn is sent to every server before the next turn is sent to any;
* the order of the servers rotates from one turn to the next (no server always goes first
  after the client's own work, or right after a given other server);
* ``pause_s`` of idle before each request, so the worker threads of the server that just
  answered have stopped spinning (OpenMP threads spin a while after a parallel region) and
  do not steal cores from the next one.

A failed request ends that server's replay of the session (as in ``runner.run_jobs``); the
other servers go on. Each record's ``wall_s`` is the sum of that server's request times in
the workload (the time its client waited for it), not the interleaved wall clock.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from benchmarks.compare.peers import (
    REPLAYS,
    run_bfcl,
    say,
    setup,
    start_peer,
    variant_of,
    warm_up,
    write_report,
)
from benchmarks.harness.arms import Arm, arm_jobs
from benchmarks.harness.peers import Peer
from benchmarks.harness.runner import Job, request_body, timed_request
from benchmarks.harness.trace_gen import Session


@dataclass
class Target:
    """One running server and the jobs to replay on it (the same sessions, in the same order)."""

    name: str
    url: str
    model: str
    jobs: list[Job]


def rotation(names: list[str], step: int) -> list[str]:
    """``names`` rotated left by ``step``: the order of the servers for the ``step``-th turn."""
    k = step % len(names) if names else 0
    return names[k:] + names[:k]


async def replay_alternated(
    targets: list[Target],
    *,
    max_tokens: int,
    pause_s: float = 0.3,
    timeout_s: float = 900.0,
    progress: bool = True,
) -> dict[str, list[dict[str, Any]]]:
    """Replay every target's jobs turn by turn, alternating the servers; records per server name."""
    from tqdm import tqdm

    if len({len(t.jobs) for t in targets}) > 1:
        raise ValueError("alternated replay: every server needs the same sessions")
    by_name = {t.name: t for t in targets}
    names = [t.name for t in targets]
    records: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    total = sum(len(j.requests) for t in targets for j in t.jobs)
    bar = tqdm(total=total, desc="alternated", unit="req", file=sys.stderr, disable=not progress)
    step = 0
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0)) as client:
        for s in range(len(targets[0].jobs) if targets else 0):
            failed: set[str] = set()
            turns = max(len(t.jobs[s].requests) for t in targets)
            for k in range(turns):
                for name in rotation(names, step):
                    t = by_name[name]
                    job = t.jobs[s]
                    if name in failed or k >= len(job.requests):
                        continue
                    spec = job.requests[k]
                    await asyncio.sleep(pause_s)
                    rec = await timed_request(client, t.url, request_body(job, spec, t.model, max_tokens))
                    rec.update(
                        label=job.label, session=job.session.session_id, turn=spec.turn, t_end=time.time()
                    )
                    records[name].append(rec)
                    bar.update(1)
                    if rec["error"]:
                        failed.add(name)
                        bar.write(f"{job.label} {job.session.session_id} turn {spec.turn}: {rec['error']}")
                step += 1
    bar.close()
    for recs in records.values():
        waited = sum(r["total_s"] or 0.0 for r in recs)
        for r in recs:
            r["wall_s"] = waited
    return records


def replay_alternated_sync(targets: list[Target], **kw: Any) -> dict[str, list[dict[str, Any]]]:
    return asyncio.run(replay_alternated(targets, **kw))


def run_side_by_side(
    args: argparse.Namespace,
    peers: list[Peer],
    sessions: dict[str, list[Session]],
    cases: list[Any],
    modes: list[str],
    notes: list[str],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """All servers at once: warm-up each, the replays alternated, then BFCL server by server."""

    replay_recs: list[dict[str, Any]] = []
    bfcl_recs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        up = []
        for peer in peers:
            srv = start_peer(stack, peer, args)
            if srv.failed:
                notes.append(f"{peer.name}: failed: {srv.info['error']}")
            else:
                up.append(srv)
        measured = dict.fromkeys((s.peer.name for s in up), 0.0)
        for srv in up:
            warm_up(srv.url, srv.model, sessions, args)
        run_id = uuid.uuid4().hex[:8]
        for workload in REPLAYS:
            if not sessions[workload] or not up:
                continue
            targets, variants = [], {}
            for srv in up:
                variants[srv.peer.name] = variant = variant_of(workload, srv.mask)
                arm = Arm(f"{srv.peer.name}|{workload}", variant)
                targets.append(
                    Target(
                        srv.peer.name,
                        srv.url,
                        srv.model,
                        arm_jobs(arm, sessions[workload], args, run_id, True),
                    )
                )
            say(f"{workload}: {len(sessions[workload])} session(s), alternated over {len(up)} servers")
            got = replay_alternated_sync(
                targets, max_tokens=args.max_tokens, pause_s=args.alternate_pause, progress=not args.quiet
            )
            for name, recs in got.items():
                for r in recs:
                    r.update(peer=name, workload=workload, variant=variants[name])
                measured[name] += recs[0]["wall_s"] if recs else 0.0
                replay_recs += recs
        for srv in up:
            t0 = time.perf_counter()
            bfcl_recs += run_bfcl(srv, cases, modes, args)
            measured[srv.peer.name] += time.perf_counter() - t0
        servers = [srv.entry(measured[srv.peer.name]) for srv in up]
    notes.append(
        f"replays alternated: the servers ran side by side, each turn sent to every server in turn "
        f"(order rotating, {args.alternate_pause:g} s idle before each request); wall = the sum of a "
        "server's own request times"
    )
    return servers, replay_recs, bfcl_recs


def run(args: argparse.Namespace) -> None:
    """``agentserve bench peers --alternate``: the servers side by side, turn by turn."""
    peers, sessions, cases, modes, notes = setup(args)
    servers, replay_recs, bfcl_recs = run_side_by_side(args, peers, sessions, cases, modes, notes)
    write_report(args, servers, replay_recs, bfcl_recs, notes, sessions)
