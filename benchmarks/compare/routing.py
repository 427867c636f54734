"""``bench routing``: affinity vs round_robin vs least_loaded behind ``agentserve serve --workers N``."""

from __future__ import annotations

import argparse

from benchmarks.harness.arms import Arm, finish, make_sessions, run_arms


def run(args: argparse.Namespace) -> None:
    from benchmarks.harness.servers import routing_available

    if not routing_available():
        raise SystemExit("routing comparison: server.routing is not on this branch")
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
    finish(
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
