"""Prefill chunks of several sequences in one forward (a burst of sub-agents starting together).

When several requests arrive at once, each has a cached prefix (the shared system prompt)
and a short rest of its own. Prefilled one after another, each rest is a forward whose cost
is mostly the weights: 8 rests of 25 tokens on a 600-token cached prefix took 609 ms one
after another, 395 ms as one forward (benchmarks/prefill_rows_cpu.py). ``prefill_rows`` runs the chunks as the
rows of ONE forward (``lean_decode.decode_forward`` with T = the longest chunk, shorter rows
padded): the linears read the weights once for all rows; each row's attention runs alone,
causal over its own cache and its own new tokens (``batched_decode.RowsKV`` with lengths
appends only the row's real tokens, padding never reaches a cache). A single long prompt's
chunk is a batch of one.

Only for the families ``lean_decode`` covers (``lean_decode_supported``); others prefill
with transformers' forward, one sequence at a time. Logits equal transformers' prefill
within fp32 rounding (tests).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from server.engines.hf.model.lean import decode_forward
from server.engines.hf.model.rows import RowsKV


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
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Row i's new queries over its cache under ``masks[i]`` (None: a fresh prompt, plain causal);
    [B, T, heads, head_dim], padding 0."""
    assert agentserve_masks is not None
    batch, heads, tokens, dim = query.shape
    out = query.new_zeros((batch, tokens, heads, dim))
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
    model: Any, caches: list[Any], chunks: list[list[int]], starts: list[int], device: torch.device
) -> torch.Tensor:
    """Append ``chunks[i]`` (at positions ``starts[i]``..) to ``caches[i]``; each row's last logits [B, V]."""
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
    )
