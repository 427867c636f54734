"""``bench inproc``: no HTTP, each turn through the engine's own prefill, cache on vs off (+ paired turn)."""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.harness import report
from benchmarks.harness.arms import finish, limit_turns, make_sessions, ratio_line, server_overrides, set_info
from benchmarks.harness.runner import Job
from benchmarks.harness.variants import build_requests
from server.families.model_facts import load_model_facts


def engine_and_label(args: argparse.Namespace, cache: bool):
    from benchmarks.harness.inproc import engine_for, random_model
    from benchmarks.harness.tokens import load_tokenizer

    if args.shape:
        import torch

        tok = load_tokenizer(args.tokenizer)
        dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = random_model(
            args.shape, len(tok), device=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32
        )
        return engine_for(model, tok, cache=cache), f"RANDOM-WEIGHT {args.shape} shape on {dev}"
    from server.config import load_settings
    from server.engines.hf.engine import HFEngine

    settings = load_settings(args.config, prefix_cache={"enabled": cache}, **server_overrides(args))
    eng = HFEngine(settings.engine_settings(), load_model_facts(settings, "hf"))
    return eng, f"{settings.model} on {eng.device}"  # (HFEngine has no model_path)


def run(args: argparse.Namespace) -> None:
    from benchmarks.harness.inproc import replay_inproc, warm_up
    from benchmarks.harness.tokens import render_ids

    sessions = make_sessions(args)
    records: list[dict[str, Any]] = []
    off_turns = {int(t) for t in args.off_turns.split(",")}
    paired: list[dict[str, Any]] = []
    eng, label = engine_and_label(args, True)
    first = build_requests(sessions[0], "good")[0].body
    warm_up(eng, render_ids(eng.tokenizer, first["messages"], first["tools"]))
    for cache in (True, False):
        eng.cache.clear()
        eng.cache.enabled = cache
        jobs = []
        for s in sessions:
            reqs = limit_turns(build_requests(s, "good"), args.max_turns)
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
    extra = [line for line in [ratio_line(rows, "cache on", "cache off", args.at_turn)] if line]
    for p in paired:
        c, u = p["cached_s"], p["uncached_s"]
        extra.append(
            f"**Paired at turn {p['turn']} ({p['prompt_tokens']} prompt tokens, "
            f"{p['cached_tokens']} cached), "
            f"cached and uncached alternated {len(c)}×: cached {', '.join(f'{x:.3f}' for x in c)} s; "
            f"uncached {', '.join(f'{x:.3f}' for x in u)} s -> cached is 1/{p['ratio']:.1f} of uncached "
            f"(medians)**"
        )
    set_info(
        "inproc", {"model": label, "max_model_len": args.context or 8192, "engine": "hf, in-process, no HTTP"}
    )
    finish(
        args.name or "inproc_cache_on_off",
        f"In-process prefill TTFT, cache on/off: {label}",
        records,
        args,
        sessions,
        ["TTFT here = engine prefill to the first logits (no HTTP, no tokenizing, no decode)"],
        extra,
    )
