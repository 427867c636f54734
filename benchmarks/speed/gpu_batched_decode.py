"""Decode step time of the hf engine's batched decode on RANDOM-WEIGHT Llama shapes (issue 26).

No HTTP, no scheduler thread: B requests are prefilled through the engine's own prefill
(prefix cache off, ragged prompt lengths ``context - 3 i``), then timed step by step:

* ``step``: ``HFEngine._decode_running`` -- what the engine loop does per step: each
  request's ``_pick`` (greedy, T=0, no logprobs; one host sync per row for the token) and
  then ONE ``steps.forward`` of all B (``batched_decode.decode_rows`` when B > 1, the plain
  single-sequence forward when B = 1);
* ``forward``: ``steps.forward`` alone (the batched model forward with per-row attention);
* ``ref``: the same model's stock transformers forward of a ``[B, 1]`` batch over one
  batched KV cache of equal lengths (one SDPA per layer over all rows, no per-row loop):
  what a padded/paged batched attention would cost, for comparison. Not an engine path.

Times are medians of per-step wall times with a device sync around each step (the engine
syncs every step anyway: it reads the sampled tokens). tok/s = B / step.

Usage (on the GPU machine; see benchmarks/results/GPU.md for how the tree is sent)::

    python3 benchmarks/speed/gpu_batched_decode.py --shapes llama-1b,llama-8b --contexts 1024,16384 \
        --batches 1,8,32 --tokenizer TOKENIZER_DIR --device cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness import report  # noqa: E402
from benchmarks.harness.inproc import engine_for, random_model  # noqa: E402
from server.engines.hf.kv.slots import kv_token_bytes  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"


class _NoLoop:
    """Stands in for the request's event loop and queue: the benchmark reads no chunks, but
    an error chunk ends the run (a step that failed must not be timed). The engine sends a
    chunk alone, or a decode turn's (queue, chunk) pairs in one call (server/engines/hf/outbox.py)."""

    def call_soon_threadsafe(self, fn: Any, arg: Any) -> None:
        for chunk in (c for _, c in arg) if isinstance(arg, list) else (arg,):
            if chunk.error is not None:
                raise RuntimeError(f"engine error during the benchmark: {chunk.error}")

    def put_nowait(self, chunk: Any) -> None:
        pass


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fits(config: Any, dtype: torch.dtype, batch: int, context: int, budget_gb: float) -> bool:
    """Whether B caches of ``context`` tokens fit in ``budget_gb`` (GrowingLayer keeps 1/4 spare room)."""
    need = kv_token_bytes(config, dtype) * batch * (context + max(256, context // 4) + 64)
    return need <= budget_gb * 1e9


def prefilled_requests(eng: Any, vocab: int, context: int, batch: int, steps: int) -> list[Any]:
    """``batch`` requests prefilled through the engine (ragged lengths), ready to decode."""
    from server.engines.base import GenerationRequest, SamplingParams
    from server.engines.hf.sampler import TokenSampler
    from server.engines.hf.sequence import SequenceState

    gen = torch.Generator().manual_seed(context + batch)
    seqs = []
    for i in range(batch):
        n = max(16, context - 3 * i)
        ids = torch.randint(100, vocab, (n,), generator=gen).tolist()
        params = SamplingParams(max_tokens=10 * steps + 100, temperature=0.0)
        req = GenerationRequest(f"r{i}", ids, params, None, f"salt{i}")
        stub = _NoLoop()
        seq = SequenceState(req, stub, stub)  # type: ignore[arg-type]
        seq.sampler = TokenSampler(params, ids, eng.vocab_size, eng.device, None)
        seq.stop_ids = frozenset()  # random weights: never stop early
        eng.runner.prefill(seq)
        seqs.append(seq)
    _sync(eng.device)
    return seqs


def time_steps(fn: Any, device: torch.device, warmup: int, steps: int) -> list[float]:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def engine_rows(eng: Any, seqs: list[Any], batch: int, warmup: int, steps: int) -> dict[str, float]:
    running = seqs[:batch]

    def step() -> None:
        eng.scheduler.running = running
        eng.scheduler.decode_turn()
        assert all(s.kv is not None for s in running), "a request ended during the benchmark"

    step_t = time_steps(step, eng.device, warmup, steps)

    def forward() -> None:
        for s in running:
            s.pending = 17
        eng.runner.forward(running)

    fwd_t = time_steps(forward, eng.device, warmup, steps)
    return {"step_ms": 1000 * statistics.median(step_t), "forward_ms": 1000 * statistics.median(fwd_t)}


def reference_ms(model: Any, vocab: int, context: int, batch: int, warmup: int, steps: int) -> float:
    """Stock batched forward over one [B, ...] cache of equal lengths (GrowingLayer: no cat per step)."""
    from server.engines.hf import runner
    from server.engines.hf.kv.growing import cache_kw, growing_cache

    device = next(model.parameters()).device
    one = growing_cache(model.config)
    ids = torch.randint(100, vocab, (1, context), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        model(input_ids=ids, **cache_kw(model, one), use_cache=True, logits_to_keep=1)
        kv = growing_cache(model.config)
        for i, layer in enumerate(one.layers):
            kv.layers[i].append(layer.keys.expand(batch, -1, -1, -1), layer.values.expand(batch, -1, -1, -1))
        del one
        tokens = torch.full((batch, 1), 17, device=device)

        def forward() -> None:
            with runner.decode_attention(device):  # the SDPA backends the engine's decode uses
                out = model(input_ids=tokens, **cache_kw(model, kv), use_cache=True)
            out.logits[:, -1].argmax(-1).tolist()  # the tokens to the host, as a server must

        times = time_steps(forward, device, warmup, steps)
    return 1000 * statistics.median(times)


def row_agreement(eng: Any, seqs: list[Any]) -> dict[str, float]:
    """Logits in the model dtype of each row of one pooled batched forward (the engine's decode path,
    ``batched_decode.decode_rows`` over a ``KVSlots`` pool) vs the same request alone, on copies of
    the requests' KV (theirs live in the engine's pool and cannot be deep-copied)."""
    from server.engines.hf import runner
    from server.engines.hf.kv.growing import cache_kw, growing_cache
    from server.engines.hf.kv.slots import KVSlots
    from server.engines.hf.model.rows import decode_rows

    pool = KVSlots(eng.model.config, eng.dtype, eng.device, 1 << 40)  # grows only to what it holds

    def copy(kv: Any, pooled: bool) -> Any:
        out = growing_cache(eng.model.config)
        if pooled:
            pool.admit(out, kv.get_seq_length() + 8)
        for mine, theirs in zip(out.layers, kv.layers, strict=True):
            mine.append(theirs.keys, theirs.values)
        return out

    with torch.no_grad(), runner.decode_attention(eng.device):
        caches = [copy(s.kv, pooled=True) for s in seqs]
        rows = decode_rows(eng.model, caches, [17] * len(seqs), eng.device, pool).float()
        alone = []
        for s in seqs:
            token = torch.tensor([[17]], device=eng.device)
            out = eng.model(input_ids=token, **cache_kw(eng.model, copy(s.kv, pooled=False)), use_cache=True)
            alone.append(out.logits[0, -1].float())
    ref = torch.stack(alone)
    return {
        "max_abs_diff": float((rows - ref).abs().max()),
        "rel_diff": float((rows - ref).norm() / ref.norm()),
        "argmax_agree": float((rows.argmax(-1) == ref.argmax(-1)).float().mean()),
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from benchmarks.harness.tokens import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    batches = [int(b) for b in args.batches.split(",")]
    rows: list[dict[str, Any]] = []
    torch.set_grad_enabled(False)
    for shape in args.shapes.split(","):
        t0 = time.perf_counter()
        model = random_model(shape, len(tok), device=str(device), dtype=dtype)
        eng = engine_for(model, tok, cache=False)
        print(f"{shape}: built in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        for context in (int(c) for c in args.contexts.split(",")):
            ok = [b for b in batches if fits(model.config, dtype, b, context, args.kv_budget_gb)]
            for b in batches:
                if b not in ok:
                    rows.append({"shape": shape, "context": context, "batch": b, "skipped": "KV over budget"})
            if not ok:
                continue
            t0 = time.perf_counter()
            seqs = prefilled_requests(eng, len(tok), context, max(ok), args.steps + args.warmup)
            print(f"  {context}: prefilled {max(ok)} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            first = context == min(int(c) for c in args.contexts.split(","))
            check = args.check and first and len(seqs) > 1
            agree = row_agreement(eng, seqs[: min(8, len(seqs))]) if check else {}
            for b in ok:
                r: dict[str, Any] = {"shape": shape, "context": context, "batch": b}
                r.update(engine_rows(eng, seqs, b, args.warmup, args.steps))
                if b == min(8, len(seqs)) and agree:
                    r["bf16_rows_vs_alone"] = agree
                rows.append(r)
            del seqs
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if not args.no_reference:
                for r in rows:
                    if r["shape"] == shape and r["context"] == context and "step_ms" in r:
                        b = r["batch"]
                        try:
                            r["ref_ms"] = reference_ms(model, len(tok), context, b, args.warmup, args.steps)
                        except torch.OutOfMemoryError:
                            # the stock forward's own KV beside the engine's pool: a reference
                            # that does not fit is reported, the engine rows are kept
                            r["ref_ms"] = None
                            r["ref_skipped"] = "out of GPU memory beside the engine's KV pool"
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
            for r in rows:
                if r["shape"] == shape and r["context"] == context and "step_ms" in r:
                    print(f"  {r}", file=sys.stderr, flush=True)
        del eng, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def write(rows: list[dict[str, Any]], args: argparse.Namespace, tokenizer_size: int) -> str:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": report.machine(),
        "commit": report.git_commit(),
        "command": "python3 benchmarks/speed/gpu_batched_decode.py " + " ".join(sys.argv[1:]),
        "torch": torch.__version__,
        "model": f"RANDOM-WEIGHT Llama shapes {args.shapes} ({'bf16' if device == 'cuda' else 'fp32'} on "
        f"{device}), vocab {tokenizer_size} (embedded SmolLM2 tokenizer); hf engine, prefix cache off",
        "steps": f"median of {args.steps} steps after {args.warmup} warm-up",
        "sdpa": "all backends (cuDNN too: before the fix)"
        if args.allow_cudnn_sdp
        else "decode_attention: flash / efficient / math, no cuDNN",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = ["# hf engine batched decode step — RANDOM-WEIGHT models", ""]
    lines += [f"- **{k}**: {v}" for k, v in meta.items()]
    lines += [
        "- step = `HFEngine._decode_running` (pick + one batched forward); forward = `steps.forward` alone; "
        "ref = stock transformers `[B, 1]` forward over one equal-length batched cache (not an engine path)",
        "",
        "| shape | context | B | step (ms) | forward (ms) | ref (ms) | step / ref | tok/s (engine) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['shape']} | {r['context']} | {r['batch']} | {r['skipped']} | | | | |")
            continue
        ref = r.get("ref_ms")
        lines.append(
            f"| {r['shape']} | {r['context']} | {r['batch']} | {r['step_ms']:.2f} | {r['forward_ms']:.2f} | "
            + (f"{ref:.2f} | {r['step_ms'] / ref:.1f}× | " if ref else "— | — | ")
            + f"{1000 * r['batch'] / r['step_ms']:.0f} |"
        )
    checks = [r for r in rows if "bf16_rows_vs_alone" in r]
    if checks:
        lines += ["", "logits in the model dtype, one batched forward vs each request alone (same KV):", ""]
        for r in checks:
            a = r["bf16_rows_vs_alone"]
            lines.append(
                f"- {r['shape']} {r['context']} B={r['batch']}: rel diff {a['rel_diff']:.2e}, "
                f"max abs {a['max_abs_diff']:.3f}, argmax agree {a['argmax_agree']:.2f}"
            )
    text = "\n".join(lines) + "\n"
    (out / f"{args.name}.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="llama-1b,llama-8b")
    ap.add_argument("--contexts", default="1024,4096,16384")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the embedded model's)")
    ap.add_argument("--device", default=None, choices=["cpu", "cuda"])
    ap.add_argument("--kv-budget-gb", type=float, default=50.0, help="skip (B, context) whose KV needs more")
    ap.add_argument("--no-reference", action="store_true", help="skip the stock batched forward")
    ap.add_argument("--check", action="store_true", help="bf16 batched-vs-alone logits, B = 8, first context")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--name", default="gpu_batched_decode")
    ap.add_argument(
        "--allow-cudnn-sdp",
        action="store_true",
        help="decode with every SDPA backend, cuDNN's too (the engine before decode_attention)",
    )
    args = ap.parse_args(argv)
    from benchmarks.harness.tokens import load_tokenizer

    if args.allow_cudnn_sdp:
        from contextlib import nullcontext

        from server.engines.hf import runner

        runner.decode_attention = lambda device: nullcontext()  # type: ignore[assignment]

    rows = run(args)
    print(write(rows, args, len(load_tokenizer(args.tokenizer))))


if __name__ == "__main__":
    main()
