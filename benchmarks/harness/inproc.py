"""In-process benchmarks: the hf engine's own prefill + prefix cache, no HTTP, torch + transformers only.
from server.families.model_facts import facts_of_model

- ``random_model(shape, ...)``: a RANDOM-WEIGHT model of a named shape (Llama-3.2-1B or
  Llama-3.1-8B layer sizes, built with ``LlamaConfig`` + ``AutoModelForCausalLM.from_config``,
  bf16 on CUDA) with the embedded tokenizer's vocabulary (49,152 instead of 128,256:
  the embedding and LM head are smaller than the real models', everything else is the
  same). Timings are real; outputs are meaningless. Results are labelled so.
- ``engine_for(model, tokenizer, ...)``: an ``HFEngine`` around that model without
  loading a checkpoint (``HFEngine(settings, facts_of_model(...), model=...)``), so
  the timed code is the engine's own ``prefill_logits`` -> ``_prefill``: prefix-cache
  match, KV blocks concatenated onto the device, chunked prefill of the rest, insert
  of the new blocks.
- ``context_sweep``: TTFT (= prefill to the first logits) of ``ctx + new`` tokens
  uncached (cache off) vs cached (the first ``ctx`` tokens were prefilled before).
- ``replay_inproc``: a session's turns through ``prefill_logits`` (the same records as
  the HTTP runner; TTFT without HTTP, tokenization or decode).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

SHAPES: dict[str, dict[str, Any]] = {
    # Llama-3.2-1B layer sizes
    "llama-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
    # Llama-3.1-8B layer sizes
    "llama-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        tie_word_embeddings=False,
    ),
    # for tests: runs on CPU in milliseconds
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
    ),
}


def random_model(
    shape: str,
    vocab_size: int,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    max_positions: int = 131072,
    seed: int = 0,
) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: choose from {', '.join(SHAPES)}")
    cfg = LlamaConfig(vocab_size=vocab_size, max_position_embeddings=max_positions, **SHAPES[shape])
    torch.manual_seed(seed)
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        except TypeError:  # older transformers
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
    return model.to(device=device, dtype=dtype).eval()


def save_random_model(shape: str, tokenizer: Any, folder: str | Path, max_positions: int = 8192) -> Path:
    """A random-weight model of ``shape`` + ``tokenizer`` saved as a transformers folder (fp32), once.

    Served with ``--model FOLDER`` it runs the whole server path (HTTP, template, prefix cache,
    cache report) with the embedded tokenizer: hit rates are the same as the embedded
    model's (same tokens, same blocks), TTFT is not (and is labelled so).
    """
    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    model = random_model(
        shape, len(tokenizer), device="cpu", dtype=torch.float32, max_positions=max_positions
    )
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.eos_token_id = eos
    model.config.eos_token_id = eos
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(folder)
    return folder


def engine_for(
    model: Any,
    tokenizer: Any,
    *,
    cache: bool = True,
    block_size: int = 32,
    memory_mb: int = 40_000,
    prefill_chunk: int | None = None,
) -> Any:
    """An HFEngine around an already built ``model`` (no checkpoint; the engine thread is not started)."""
    from server.config import load_settings
    from server.engines.hf.engine import HFEngine
    from server.families.model_facts import facts_of_model

    settings = load_settings(
        prefix_cache={"enabled": cache, "block_size": block_size, "memory_mb": memory_mb},
        max_model_len=int(model.config.max_position_embeddings),
        prefill_chunk_tokens=prefill_chunk,
    )
    return HFEngine(settings.engine_settings(), facts_of_model(settings, tokenizer, model), model=model)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_prefill(eng: Any, ids: list[int]) -> tuple[float, int]:
    _sync(eng.device)
    t0 = time.perf_counter()
    logits, cached = eng.prefill_logits(ids)
    float(logits[0])  # forces the result (and a device sync)
    _sync(eng.device)
    return time.perf_counter() - t0, cached


def warm_up(eng: Any, ids: list[int], new_tokens: int = 256, rounds: int = 2) -> None:
    """Run the uncached and the cached prefill path a few times (kernels, cuBLAS handles,
    allocator), then empty the cache: the first calls on a GPU are not representative."""
    enabled = eng.cache.enabled
    for _ in range(rounds):
        eng.cache.enabled = False
        timed_prefill(eng, ids)
        eng.cache.enabled = True
        eng.cache.clear()
        timed_prefill(eng, ids[: max(1, len(ids) - new_tokens)])
        timed_prefill(eng, ids)
    eng.cache.clear()
    eng.cache.enabled = enabled


def long_token_stream(tokenizer: Any, n_tokens: int, seed: int = 0) -> list[int]:
    """Real agent-session tokens (generated sessions rendered by the server's template)."""
    from benchmarks.harness.tokens import render_ids
    from benchmarks.harness.trace_gen import generate_session

    ids: list[int] = []
    i = 0
    while len(ids) < n_tokens:
        s = generate_session(seed, i, context=131072, steps=50)
        ids += render_ids(tokenizer, s.messages, s.tools)
        i += 1
    return ids[:n_tokens]


def context_sweep(
    model: Any,
    tokenizer: Any,
    contexts: list[int],
    *,
    new_tokens: int = 256,
    repeats: int = 3,
    label: str = "",
    progress: bool = True,
    prefill_chunk: int | None = None,
) -> list[dict[str, Any]]:
    """Per context: uncached TTFT of ctx+new tokens vs cached (ctx prefilled before, then ctx+new)."""
    from tqdm import tqdm

    stream = long_token_stream(tokenizer, max(contexts) + (repeats + 1) * new_tokens)
    off = engine_for(model, tokenizer, cache=False, prefill_chunk=prefill_chunk)
    on = engine_for(model, tokenizer, cache=True, prefill_chunk=prefill_chunk)
    warm_up(on, stream[: min(2048, len(stream))], new_tokens)
    warm_up(off, stream[: min(2048, len(stream))], new_tokens)
    rows = []
    for ctx in tqdm(contexts, desc=f"context sweep {label}", file=sys.stderr, disable=not progress):
        suffixes = [stream[ctx + r * new_tokens : ctx + (r + 1) * new_tokens] for r in range(repeats)]
        prefix = stream[:ctx]
        uncached = [timed_prefill(off, prefix + s)[0] for s in suffixes]
        on.cache.clear()
        cold, _ = timed_prefill(on, prefix)  # cache on, first time: prefill + store the blocks
        cached_runs = [timed_prefill(on, prefix + s) for s in suffixes]
        rows.append(
            {
                "label": label,
                "context": ctx,
                "new_tokens": new_tokens,
                "repeats": repeats,
                "uncached_s": statistics.median(uncached),
                "uncached_all_s": uncached,
                "cold_fill_s": cold,
                "cached_s": statistics.median(t for t, _ in cached_runs),
                "cached_all_s": [t for t, _ in cached_runs],
                "cached_tokens": cached_runs[0][1],
            }
        )
        rows[-1]["speedup"] = rows[-1]["uncached_s"] / rows[-1]["cached_s"]
        on.cache.clear()
        if on.device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def paired_at_turn(eng: Any, ids: list[int], repeats: int = 3) -> dict[str, Any]:
    """TTFT of one prompt cached vs uncached, alternated ``repeats`` times under the same load.

    Call it when the cache holds the session's earlier turns: each cached run is followed by
    restoring the cache to that state (the blocks the run added are dropped), each uncached
    run has the cache switched off. Alternating makes the ratio robust on a shared machine.
    """
    cache = eng.cache
    saved = cache.snapshot()
    cached_t, uncached_t, cached_n = [], [], 0
    for _ in range(repeats):
        t, cached_n = timed_prefill(eng, ids)
        cached_t.append(t)
        cache.restore(saved)
        cache.enabled = False
        uncached_t.append(timed_prefill(eng, ids)[0])
        cache.enabled = True
    return {
        "prompt_tokens": len(ids),
        "cached_tokens": cached_n,
        "cached_s": cached_t,
        "uncached_s": uncached_t,
        "ratio": statistics.median(uncached_t) / statistics.median(cached_t),
    }


def replay_inproc(
    eng: Any,
    jobs: list[Any],
    *,
    progress: bool = True,
    paired_turn: int | None = None,
    paired_repeats: int = 3,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Replay jobs (see runner.Job) through the engine's prefill; one record per turn.

    With ``paired_turn``, that turn is also measured by ``paired_at_turn`` before it is replayed.
    Returns (records, paired results)."""
    from tqdm import tqdm

    from benchmarks.harness.tokens import render_ids

    total = sum(len(j.requests) for j in jobs)
    bar = tqdm(total=total, desc="in-process replay", file=sys.stderr, disable=not progress)
    records: list[dict[str, Any]] = []
    paired: list[dict[str, Any]] = []
    for job in jobs:
        for spec in job.requests:
            ids = render_ids(eng.tokenizer, spec.body["messages"], spec.body["tools"])
            if paired_turn is not None and spec.turn == paired_turn and eng.cache.enabled:
                paired.append(
                    {
                        "label": job.label,
                        "session": job.session.session_id,
                        "turn": spec.turn,
                        **paired_at_turn(eng, ids, paired_repeats),
                    }
                )
            ttft, cached = timed_prefill(eng, ids)
            records.append(
                {
                    "label": job.label,
                    "session": job.session.session_id,
                    "turn": spec.turn,
                    "ttft_s": ttft,
                    "total_s": ttft,
                    "prompt_tokens": len(ids),
                    "cached_tokens": cached,
                    "completion_tokens": 0,
                    "worker": None,
                    "cache": None,
                    "error": None,
                }
            )
            bar.update(1)
    bar.close()
    return records, paired


def plot_sweep(rows: list[dict[str, Any]], path: Any, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=80)
    for label in dict.fromkeys(r["label"] for r in rows):
        rs = [r for r in rows if r["label"] == label]
        xs = [r["context"] for r in rs]
        ax.plot(xs, [1000 * r["uncached_s"] for r in rs], marker="o", label=f"{label} uncached")
        ax.plot(xs, [1000 * r["cached_s"] for r in rs], marker="s", linestyle="--", label=f"{label} cached")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context tokens (cached prefix), + new tokens")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    from benchmarks.harness.report import save_png

    save_png(fig, path)
    plt.close(fig)
