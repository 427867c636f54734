"""``bench cache``: prefix cache on vs off, good practice (cache off only on --off-turns: full prefills)."""

from __future__ import annotations

import argparse

from benchmarks.harness import report
from benchmarks.harness.arms import Arm, cache_server, finish, make_sessions, ratio_line, run_arms


def run(args: argparse.Namespace) -> None:
    sessions = make_sessions(args)
    n_turns = max(len(s.turns) for s in sessions)
    off_turns = {int(t) for t in args.off_turns.split(",") if int(t) <= n_turns}
    arms = [
        Arm("cache on", "good", cache_server(args, True)),
        Arm("cache off", "good", cache_server(args, False), off_turns),
    ]
    records = run_arms(arms, sessions, args)
    rows = report.summarize(records, args.at_turn)
    extra = [line for line in [ratio_line(rows, "cache on", "cache off", args.at_turn)] if line]
    finish(
        args.name or "cache_on_off",
        "Prefix cache on vs off (good practice)",
        records,
        args,
        sessions,
        [f"cache off is measured on turns {sorted(off_turns)} only (every turn is a full prefill there)"],
        extra,
    )
