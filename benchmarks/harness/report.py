"""Summaries, markdown tables, PNG plots and the raw JSON of a benchmark run.

Hit rate = cached / ideal, where a request's *ideal* is the size of the same
session's previous prompt (turn k-1): with an append-only context all of it could
come from cache. Turn 1 has no ideal and is left out of the hit rate (its cross-session
hits on the shared system prompt + tools are real but not what is compared here).
Cached tokens come in whole cache blocks (32 tokens on the hf engine) and the server
always recomputes at least one token, so a perfect session scores a little under 1.

The loss (ideal - cached) is broken down by the miss type the server reported for the
request (``cache.type``, docs/cache.md); a request with no type lost only what block-granular
caching cannot keep (the partial last block, the generation prompt): "tail".
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    desc = f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    try:
        import torch

        desc += f"; torch {torch.__version__}"
        if torch.cuda.is_available():
            desc += f", GPU {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return desc


def git_commit() -> str:
    """The commit of the code that runs (read once, when this module is imported)."""
    return _COMMIT


def _read_commit() -> str:
    if os.environ.get("AGENTSERVE_BENCH_COMMIT"):  # a copied tree (e.g. on the GPU machine) has no .git
        return os.environ["AGENTSERVE_BENCH_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).parent,
        )
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ":(top)",
                ":(top,exclude)benchmarks/results",
            ],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).parent,
        ).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


_COMMIT = _read_commit()


def add_ideal(records: list[dict[str, Any]]) -> None:
    """Set ``ideal`` on every record: the previous turn's prompt tokens of the same job, else None."""
    by_job: dict[tuple[str, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in records:
        by_job[(r["label"], r["session"])][r["turn"]] = r
    for turns in by_job.values():
        for t, r in turns.items():
            prev = turns.get(t - 1)
            r["ideal"] = (
                prev["prompt_tokens"] if prev and prev.get("prompt_tokens") and not r.get("error") else None
            )


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _p90(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


def _same_worker_share(records: list[dict[str, Any]]) -> float | None:
    """Share of turns (k >= 2) served by the worker that served turn k-1 of the same session."""
    by: dict[tuple[str, int], str] = {
        (r["session"], r["turn"]): r["worker"] for r in records if r.get("worker")
    }
    pairs = [(w, by.get((s, t - 1))) for (s, t), w in by.items() if (s, t - 1) in by]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else None


def summarize(records: list[dict[str, Any]], at_turn: int = 30) -> list[dict[str, Any]]:
    add_ideal(records)
    labels: list[str] = []
    for r in records:
        if r["label"] not in labels:
            labels.append(r["label"])
    rows = []
    for label in labels:
        rs = [r for r in records if r["label"] == label]
        ok = [r for r in rs if not r.get("error") and r.get("ttft_s") is not None]
        with_ideal = [r for r in ok if r.get("ideal")]
        ideal = sum(r["ideal"] for r in with_ideal)
        cached_i = sum(r["cached_tokens"] or 0 for r in with_ideal)
        prompt = sum(r["prompt_tokens"] or 0 for r in ok)
        cached = sum(r["cached_tokens"] or 0 for r in ok)
        at = [r["ttft_s"] for r in ok if r["turn"] == at_turn]
        at_prompt = [r["prompt_tokens"] for r in ok if r["turn"] == at_turn]
        rows.append(
            {
                "label": label,
                "sessions": len({r["session"] for r in rs}),
                "requests": len(rs),
                "errors": len(rs) - len(ok),
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "hit_rate": cached_i / ideal if ideal else None,
                "cached_share": cached / prompt if prompt else None,
                "ttft_median_s": _median([r["ttft_s"] for r in ok]),
                "ttft_p90_s": _p90([r["ttft_s"] for r in ok]),
                f"ttft_turn{at_turn}_s": _median(at),
                f"prompt_turn{at_turn}": _median(at_prompt),
                "total_median_s": _median([r["total_s"] for r in ok]),
                "workers": len({r["worker"] for r in ok if r.get("worker")}) or None,
                "same_worker_share": _same_worker_share(ok),
            }
        )
    return rows


_NO_MISS = ("cache off", "tail")


def loss_by_type(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per label: tokens of the ideal that were not served, by the miss type the server reported."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        if r.get("error") or not r.get("ideal"):
            continue
        lost = max(0, r["ideal"] - (r["cached_tokens"] or 0))
        cache = r.get("cache") or {}
        kind = cache.get("type") or ("cache off" if "cache is off" in (cache.get("reason") or "") else "tail")
        by = out.setdefault(r["label"], {})
        by[kind] = by.get(kind, 0) + lost
    return out


def loss_lines(records: list[dict[str, Any]]) -> list[str]:
    """A markdown table: each variant's hit-rate loss (share of its ideal) per miss type."""
    losses = loss_by_type(records)
    kinds = sorted(
        {k for by in losses.values() for k, v in by.items() if v}, key=lambda k: (k in _NO_MISS, k)
    )
    if not kinds:
        return []
    ideal = defaultdict(int)
    for r in records:
        if not r.get("error") and r.get("ideal"):
            ideal[r["label"]] += r["ideal"]
    lines = [
        "Hit-rate loss by miss type (share of the ideal; tail = the partial last block, not a miss):",
        "",
        "| variant | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for label, by in losses.items():
        cells = [_fmt(by.get(k, 0) / ideal[label], "pct") if ideal[label] else "—" for k in kinds]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _fmt(v: Any, kind: str = "") -> str:
    if v is None:
        return "—"
    if kind == "pct":
        return f"{100 * v:.1f} %"
    if kind == "s":
        return f"{v:.3f}"
    if isinstance(v, float):
        return f"{v:.0f}"
    return str(v)


def markdown(
    title: str,
    rows: list[dict[str, Any]],
    meta: dict[str, Any],
    at_turn: int = 30,
    extra_lines: list[str] | None = None,
    reasons: dict[str, str] | None = None,
    losses: list[str] | None = None,
) -> str:
    lines = [f"# {title}", ""]
    for k in ("machine", "model", "server", "date", "commit", "command"):
        if meta.get(k):
            val = f"`{meta[k]}`" if k == "command" else meta[k]
            lines.append(f"- **{k}**: {val}")
    for n in meta.get("notes", []):
        lines.append(f"- {n}")
    lines += [
        "",
        f"| variant | sessions | requests | errors | hit rate (cached ÷ ideal) | cached ÷ prompt | "
        f"TTFT median (s) | TTFT p90 (s) | TTFT turn {at_turn} (s) | prompt turn {at_turn} | workers | "
        "same worker as turn k-1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['sessions']} | {r['requests']} | {r['errors']} | "
            f"{_fmt(r['hit_rate'], 'pct')} | {_fmt(r['cached_share'], 'pct')} | "
            f"{_fmt(r['ttft_median_s'], 's')} | {_fmt(r['ttft_p90_s'], 's')} | "
            f"{_fmt(r[f'ttft_turn{at_turn}_s'], 's')} | {_fmt(r[f'prompt_turn{at_turn}'])} | "
            f"{_fmt(r['workers'])} | {_fmt(r['same_worker_share'], 'pct')} |"
        )
    if extra_lines:
        lines += [""] + extra_lines
    if losses:
        lines += [""] + losses
    if reasons:
        lines += ["", "First cache-miss reason the server reported, per variant:", ""]
        for label, why in reasons.items():
            lines.append(f"- {label}: {why}")
    return "\n".join(lines) + "\n"


def first_reasons(records: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in records:
        cache = r.get("cache") or {}
        why = cache.get("reason")
        if why and cache.get("type") != "first_request" and r["label"] not in out:
            kind = f"{cache['type']}, " if cache.get("type") else ""
            out[r["label"]] = f"turn {r['turn']}, {kind}token {cache.get('diverged_at_token')}: {why[:220]}"
    return out


def save_png(fig: Any, path: Path) -> None:
    """Save a figure as a small palette PNG (results are committed: keep them a few tens of KB)."""
    fig.savefig(path)
    try:
        from PIL import Image

        with Image.open(path) as im:
            small = im.convert("RGB").quantize(colors=64)
        small.save(path, optimize=True)
    except (ImportError, OSError):
        pass


def plot(records: list[dict[str, Any]], path_prefix: Path, title: str, ttft: bool = True) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    add_ideal(records)
    labels: list[str] = []
    for r in records:
        if r["label"] not in labels:
            labels.append(r["label"])
    out = []
    if ttft:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=80)
        for label in labels:
            by_turn: dict[int, list[float]] = defaultdict(list)
            for r in records:
                if r["label"] == label and r.get("ttft_s") is not None and not r.get("error"):
                    by_turn[r["turn"]].append(r["ttft_s"])
            ts = sorted(by_turn)
            ys = [statistics.median(by_turn[t]) for t in ts]
            ax.plot(ts, ys, marker="." if len(ts) < 15 else None, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("turn")
        ax.set_ylabel("TTFT (s, median over sessions)")
        ax.set_title(f"{title}: TTFT by turn", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = Path(f"{path_prefix}_ttft.png")
        save_png(fig, p)
        plt.close(fig)
        out.append(p)

    fig, ax = plt.subplots(figsize=(7, 4), dpi=80)
    for label in labels:
        cum_c: dict[int, int] = defaultdict(int)
        cum_i: dict[int, int] = defaultdict(int)
        for r in records:
            if r["label"] == label and r.get("ideal"):
                cum_c[r["turn"]] += r["cached_tokens"] or 0
                cum_i[r["turn"]] += r["ideal"]
        ts = sorted(cum_i)
        if not ts:
            continue
        c = i = 0
        ys = []
        for t in ts:
            c += cum_c[t]
            i += cum_i[t]
            ys.append(100 * c / i)
        ax.plot(ts, ys, label=label)
    ax.set_ylim(-2, 102)
    ax.set_xlabel("turn")
    ax.set_ylabel("cumulative hit rate (% of ideal)")
    ax.set_title(f"{title}: cumulative cache hit rate", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = Path(f"{path_prefix}_hit.png")
    save_png(fig, p)
    plt.close(fig)
    out.append(p)
    return out


def slim_record(r: dict[str, Any]) -> dict[str, Any]:
    """A record for the committed JSON: no nulls, 4 decimals, the cache report without repeats."""
    out: dict[str, Any] = {}
    for k, v in r.items():
        if v is None or k in ("t_end",) or (k == "status" and v == 200):
            continue
        if isinstance(v, float):
            v = round(v, 4)
        if k == "cache":
            v = {
                ck: (cv[:200] if isinstance(cv, str) else cv)
                for ck, cv in v.items()
                if cv is not None and ck not in ("cached_tokens", "prompt_tokens", "session_key_source")
            }
            if not v:
                continue
        out[k] = v
    return out


def save(
    name: str,
    title: str,
    records: list[dict[str, Any]],
    meta: dict[str, Any],
    *,
    at_turn: int = 30,
    extra_lines: list[str] | None = None,
    out_dir: Path = RESULTS,
    plots: bool = True,
    ttft_plot: bool = True,
) -> dict[str, Any]:
    """Write <name>.json (meta + summary + raw records), <name>.md and the two PNGs; returns the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "commit": git_commit(),
        **meta,
    }
    rows = summarize(records, at_turn)
    md = markdown(title, rows, meta, at_turn, extra_lines, first_reasons(records), loss_lines(records))
    slim = [slim_record(r) for r in records]
    (out_dir / f"{name}.json").write_text(
        json.dumps({"meta": meta, "summary": rows, "records": slim}, separators=(",", ":")) + "\n"
    )
    (out_dir / f"{name}.md").write_text(md)
    if plots:
        plot(records, out_dir / name, title, ttft=ttft_plot)
    return {"rows": rows, "markdown": md}
