"""``bench variants``: good practice vs each way of breaking the cache, a fresh server per variant."""

from __future__ import annotations

import argparse

from benchmarks.harness import report
from benchmarks.harness.arms import Arm, default_server, finish, make_sessions, run_arms
from benchmarks.harness.variants import VARIANTS

DEFAULT_VARIANTS = ("good", "timestamp", "shuffled_keys", "edited_observation", "tools_remove")


def run(args: argparse.Namespace) -> None:
    names = args.variants.split(",") if args.variants else list(DEFAULT_VARIANTS)
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variant(s) {bad}: choose from {', '.join(VARIANTS)}")
    sessions = make_sessions(args)
    records = run_arms([Arm(v, v, default_server(args)) for v in names], sessions, args)
    rows = report.summarize(records, args.at_turn)
    good = next((r for r in rows if r["label"] == "good"), None)
    extra = []
    if good and good["hit_rate"]:
        extra = ["| variant | hit rate ÷ good's | TTFT median ÷ good's |", "|---|---|---|"]
        for r in rows:
            hr = f"{r['hit_rate'] / good['hit_rate']:.2f}" if r["hit_rate"] is not None else "—"
            tt = f"{r['ttft_median_s'] / good['ttft_median_s']:.1f}×" if r["ttft_median_s"] else "—"
            extra.append(f"| {r['label']} | {hr} | {tt} |")
    finish(
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
