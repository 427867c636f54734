"""``bench swe``: the real SWE-agent traces: good, cache off, timestamp, shuffled keys, edited observation."""

from __future__ import annotations

import argparse

from benchmarks.harness import report
from benchmarks.harness.arms import (
    Arm,
    cache_server,
    default_server,
    finish,
    ratio_line,
    run_arms,
    swe_sessions,
)


def run(args: argparse.Namespace) -> None:
    sessions = swe_sessions(args)
    n_turns = min(len(s.turns) for s in sessions)
    if args.at_turn > n_turns:
        args.at_turn = n_turns  # the traces are short: report the last turn they all have
    off_turns = {int(t) for t in args.off_turns.split(",") if int(t) <= n_turns} | {args.at_turn}
    local = default_server(args)
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
    extra = [line for line in [ratio_line(rows, "good", "cache off", args.at_turn)] if line]
    finish(
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
