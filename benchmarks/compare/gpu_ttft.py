"""``bench gpu-ttft``: no HTTP, TTFT vs context (2k-32k) cached vs uncached on RANDOM-WEIGHT Llama shapes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.harness import report
from benchmarks.harness.arms import command_line


def run(args: argparse.Namespace) -> None:
    import torch

    from benchmarks.harness.inproc import context_sweep, plot_sweep, random_model
    from benchmarks.harness.tokens import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    contexts = [int(c) for c in args.contexts.split(",")]
    rows = []
    chunks: list[int | None] = (
        [int(c) for c in args.prefill_chunks.split(",")] if args.prefill_chunks else [None]
    )
    for shape in args.shapes.split(","):
        t0 = time.perf_counter()
        model = random_model(
            shape, len(tok), device=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32
        )
        print(f"{shape}: built in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        for chunk in chunks:
            rows += context_sweep(
                model,
                tok,
                contexts,
                new_tokens=args.new_tokens,
                repeats=args.repeats,
                label=shape if len(chunks) == 1 else f"{shape} chunk {chunk}",
                progress=not args.quiet,
                prefill_chunk=chunk,
            )
        del model
        if dev == "cuda":
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or "gpu_ttft_context"
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": report.machine(),
        "commit": report.git_commit(),
        "command": command_line(args),
        "model": f"RANDOM-WEIGHT Llama shapes {args.shapes} "
        f"({'bf16' if dev == 'cuda' else 'fp32'} on {dev}), "
        f"embedded SmolLM2 tokenizer/vocab "
        f"({len(tok)}); hf engine prefill + prefix cache (block 32), in-process, no HTTP",
    }
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = ["# TTFT vs context, cached vs uncached — RANDOM-WEIGHT models", ""]
    lines += [f"- **{k}**: {v}" for k, v in meta.items()]
    lines += [
        f"- TTFT = the engine's prefill of context + {args.new_tokens} new tokens to the first logits; "
        f"uncached = prefix cache off; cached = the context was prefilled before (cache on); median of "
        f"{args.repeats}; 'cold fill' = first prefill of the context with the cache on "
        "(includes storing the blocks)",
        "",
        "| shape | context | uncached (ms) | cached (ms) | speedup | cold fill (ms) | cached tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['context']} | {1000 * r['uncached_s']:.1f} | {1000 * r['cached_s']:.1f} | "
            f"{r['speedup']:.1f}× | {1000 * r['cold_fill_s']:.1f} | {r['cached_tokens']} |"
        )
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    if not args.no_plots:
        plot_sweep(rows, str(out / f"{name}.png"), f"TTFT vs context, RANDOM-WEIGHT {args.shapes}, {dev}")
    print("\n".join(lines))
