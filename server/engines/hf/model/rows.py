"""The rows forward: several sequences as the rows of ONE forward, each over its own KV.

Decode (``decode_rows``): every running sequence advances by one token.

Each running request keeps its own KV cache (a ``DynamicCache`` of ``GrowingLayer``s, of its
own length, restored from the prefix cache without a copy). A decode step stacks the B new
tokens into one ``[B, 1]`` forward, so the weights are read once per step instead of once
per request (what makes decode fast: on this CPU a 135M model's step is weight-bound). Only
attention differs per row: ``RowsKV`` stands in for the cache during that forward — its
``update`` appends row i's new key/value to sequence i's own cache and hands back the list
of per-row K/V, and the attention function registered as ``ROWS_ATTENTION`` runs SDPA row
by row over each sequence's own K/V (no padding, no copy of a reused prefix) -- or, when
every cache lives in a slot of the engine's ``KVSlots`` pool (``kv/slots.py``), one SDPA per
layer over the pool's rows with a padding mask. Every other layer (projections, MLP, norms,
rotary with per-row positions, the LM head) runs batched.

Chosen over transformers' own continuous batching (``generate_batch`` / paged attention):
that owns its scheduler and a paged KV pool of its own, so our prefix cache, tiers, masks,
penalties and per-request stop handling would have to move inside it; here each request's
state and cache stay exactly as they are when it runs alone, and a batch of one is the
old path. Row results equal the single-sequence forward within fp32 rounding (tests).

On CUDA a decode forward (batched or not) runs under ``decode_attention``: SDPA without
the cuDNN backend. PyTorch picks cuDNN attention on an H100 for these shapes, and cuDNN
builds an execution plan for every new shape -- a decode step makes every KV one token
longer, so it never hits its plan cache: 3.7 ms of host time per attention call (per row,
per layer), measured (benchmarks/results/GPU.md). Flash / memory-efficient
SDPA take ~28 us for the same call.

Prefill (``prefill_rows``): the chunks of several sequences in one forward (a burst of
sub-agents starting together: each has a cached prefix, the shared system prompt, and a short
rest of its own). Prefilled one after another, each rest is a forward whose cost is mostly
the weights: 8 rests of 25 tokens on a 600-token cached prefix took 609 ms one after another,
395 ms as one forward (benchmarks/speed/prefill_rows_cpu.py). The chunks are the rows of
``lean.decode_forward`` with T = the longest chunk, shorter rows padded: the linears read the
weights once for all rows; each row's attention runs alone, causal over its own cache and its
own new tokens (``RowsKV`` with lengths appends only the row's real tokens, padding never
reaches a cache). A single long prompt's chunk is a batch of one. Only for the families
``lean`` covers (``lean_decode_supported``); others prefill with transformers' forward, one
sequence at a time (runner.py). Logits equal transformers' prefill within fp32 rounding (tests).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface

from server.engines.hf.kv.growing import cache_kw
from server.engines.hf.kv.slots import KVSlots, PooledStep
from server.engines.hf.model.lean import decode_forward, lean_decode_supported
from server.engines.hf.model.shared_prefix import (
    shared_prefix_attention,
    shared_prefix_available,
    worth_sharing,
)

ROWS_ATTENTION = "agentserve_rows"


class RowsKV:
    """The stand-in cache of a batched decode forward: row i reads and grows ``caches[i]``.

    With a ``PooledStep`` (every cache lives in one ``KVSlots`` pool, padding within bounds)
    a layer's B new keys/values go into the pool with one indexed store, and the attention
    reads the pool's rows at once; otherwise each row appends to and reads its own cache.
    ``lengths`` (a batched prefill, ``prefill_rows``): row i appends only its first
    ``lengths[i]`` tokens, so padding never reaches a cache.
    """

    def __init__(
        self, caches: list[Any], pooled: PooledStep | None = None, lengths: list[int] | None = None
    ) -> None:
        self.caches = caches
        self.pooled = pooled
        self.lengths = lengths

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        if self.pooled is not None:
            k, v = self.pooled.write(layer_idx, key_states, value_states)
            for cache in self.caches:
                cache.layers[layer_idx].advance(1)
            return k, v
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for i, cache in enumerate(self.caches):
            k, v = key_states[i : i + 1], value_states[i : i + 1]
            if self.lengths is not None:  # a prefill row: its real tokens only
                k, v = k[:, :, : self.lengths[i]], v[:, :, : self.lengths[i]]
            k, v = cache.update(k, v, layer_idx)
            keys.append(k)
            values.append(v)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(int(c.get_seq_length()) for c in self.caches)


def rows_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: list[torch.Tensor] | torch.Tensor,
    value: list[torch.Tensor] | torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    agentserve_pooled: PooledStep | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Row i's one query over sequence i's K/V; output [B, 1, heads, head_dim].

    With grouped-query attention the G query heads that share a KV head become G query
    positions of that head (one query token attends to past keys only, so no causal mask):
    no copy of the K/V is made to repeat heads. Pooled (``key`` one tensor over the pool's
    rows ``lo..hi``): one SDPA with the step's padding mask, queries placed at their rows --
    or, when the step's rows share a prefix (``step.shared``), that prefix read once
    (shared_prefix.py).
    """
    batch, heads, _, dim = query.shape
    if isinstance(key, torch.Tensor):
        assert agentserve_pooled is not None and isinstance(value, torch.Tensor)
        step = agentserve_pooled
        kv_heads = key.shape[1]
        q = query.reshape(batch, kv_heads, heads // kv_heads, dim)
        if step.shared:
            out = shared_prefix_attention(q, key, value, step, scaling)
            return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None
        out = F.scaled_dot_product_attention(step.to_span(q), key, value, attn_mask=step.mask, scale=scaling)
        out = step.from_span(out)
        return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None
    outs = []
    for i, (k, v) in enumerate(zip(key, value, strict=True)):
        kv_heads = k.shape[1]
        q = query[i : i + 1].reshape(1, kv_heads, heads // kv_heads, dim)
        out = F.scaled_dot_product_attention(q, k, v, scale=scaling)
        outs.append(out.reshape(1, heads, 1, dim))
    return torch.cat(outs, dim=0).transpose(1, 2).contiguous(), None


AttentionInterface.register(ROWS_ATTENTION, rows_attention)

# SDPA backends of a decode forward on CUDA: all but cuDNN (a plan per KV length, see above)
DECODE_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def decode_attention(device: torch.device) -> AbstractContextManager[Any]:
    """The context a decode forward runs in on ``device`` (CUDA: SDPA without cuDNN)."""
    return sdpa_kernel(DECODE_SDPA_BACKENDS) if device.type == "cuda" else nullcontext()


@contextmanager
def _attention(config: Any, name: str) -> Iterator[None]:
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def decode_rows(
    model: Any,
    caches: list[Any],
    tokens: list[int],
    device: torch.device,
    pool: KVSlots | None = None,
    shared: int = 0,
) -> torch.Tensor:
    """Run ``tokens[i]`` through the model on top of ``caches[i]`` for every i; logits [B, V].

    Every cache grows by one token. Positions are each sequence's own length. Pooled when
    every cache lives in ``pool`` and the padding is within bounds (``kv/slots.py``). The forward
    is ``lean.decode_forward`` where the family allows it, else transformers' (a 4-D
    placeholder mask passed through untouched: attention is per row, causal by length).
    ``shared``: tokens every row's sequence starts with (the caller knows the tokens); a pooled
    step reads them once when that pays (shared_prefix.py).
    """
    lengths = [int(c.get_seq_length()) for c in caches]
    pooled = None
    if pool is not None:
        slots = [pool.slot_of(c) for c in caches]
        fits = all(s is not None for s in slots) and PooledStep.fits(slots, lengths)  # type: ignore[arg-type]
        if fits and pool.ensure(max(lengths) + 1):  # every new token lands inside its row
            share = min(shared, *lengths)
            share = share if worth_sharing(len(caches), share) and shared_prefix_available(device) else 0
            pooled = PooledStep(pool, slots, lengths, share)  # type: ignore[arg-type]
    positions = torch.tensor([[n] for n in lengths], device=device)
    ids = torch.tensor([[t] for t in tokens], device=device)
    rows = RowsKV(caches, pooled)
    if lean_decode_supported(model):
        return decode_forward(model, rows, ids, positions, rows_attention, agentserve_pooled=pooled)
    placeholder = torch.zeros((len(tokens), 1, 1, 1), device=device, dtype=torch.bool)
    with _attention(model.config, ROWS_ATTENTION):
        out = model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=placeholder,
            **cache_kw(model, rows),
            use_cache=True,
            **({"agentserve_pooled": pooled} if pooled is not None else {}),
        )
    logits: torch.Tensor = out.logits[:, -1]
    return logits


def gqa_in_sdpa(mask: torch.Tensor | None, device: torch.device) -> bool:
    """Whether SDPA's ``enable_gqa`` keeps a fast kernel: on CPU (measured: 326 us vs 376 us with
    the K/V repeated, 25 queries over 625 keys), or without a mask. CUDA's masked kernels do not
    take grouped heads and would fall back to the math kernel, which holds every score in memory
    (transformers' ``use_gqa_in_sdpa`` draws the same line)."""
    return mask is None or device.type == "cpu"


def ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: list[torch.Tensor],
    value: list[torch.Tensor],
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    agentserve_masks: list[torch.Tensor | None] | None = None,
    agentserve_dtype: torch.dtype | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Row i's new queries over its cache under ``masks[i]`` (None: a fresh prompt, plain causal);
    [B, T, heads, head_dim], padding 0. ``agentserve_dtype``: q, k and v cast to it for SDPA (a
    bfloat16 prefill, linears/prefill_dtype.py); the output stays in the query's dtype."""
    assert agentserve_masks is not None
    batch, heads, tokens, dim = query.shape
    out = query.new_zeros((batch, tokens, heads, dim))
    if agentserve_dtype is not None:
        query = query.to(agentserve_dtype)
        key = [k.to(agentserve_dtype) for k in key]
        value = [v.to(agentserve_dtype) for v in value]
    for i, (k, v, mask) in enumerate(zip(key, value, agentserve_masks, strict=True)):
        n = k.shape[2] if mask is None else mask.shape[0]
        gqa = gqa_in_sdpa(mask, query.device)
        if not gqa and k.shape[1] != heads:  # each query head its own copy of its KV head
            k = k.repeat_interleave(heads // k.shape[1], dim=1)
            v = v.repeat_interleave(heads // v.shape[1], dim=1)
        rows = F.scaled_dot_product_attention(
            query[i : i + 1, :, :n],
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None,
            scale=scaling,
            enable_gqa=gqa,
        )
        out[i, :n] = rows[0].transpose(0, 1)
    return out, None


def prefill_rows(
    model: Any,
    caches: list[Any],
    chunks: list[list[int]],
    starts: list[int],
    device: torch.device,
    attention_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Append ``chunks[i]`` (at positions ``starts[i]``..) to ``caches[i]``; each row's last logits [B, V].

    ``attention_dtype``: what each row's attention computes in (None: the model's dtype; bfloat16
    inside a bfloat16 prefill, linears/prefill_dtype.py)."""
    lengths = [len(c) for c in chunks]
    width = max(lengths)
    ids = torch.tensor([c + [0] * (width - len(c)) for c in chunks], device=device)
    offsets = torch.arange(width, device=device)
    positions = torch.tensor(starts, device=device)[:, None] + offsets[None, :]
    last = torch.tensor([n - 1 for n in lengths], device=device)
    # row i's n new tokens over its start + n keys: new token j sees keys 0 .. start + j (made once,
    # not per layer); a fresh prompt (start 0) is plain causal: SDPA's is_causal, its fast path
    masks = [
        None if start == 0 else torch.ones((n, start + n), dtype=torch.bool, device=device).tril(start)
        for n, start in zip(lengths, starts, strict=True)
    ]
    return decode_forward(
        model,
        RowsKV(caches, lengths=lengths),
        ids,
        positions,
        ragged_attention,
        last=last,
        agentserve_masks=masks,
        agentserve_dtype=attention_dtype,
    )
