"""Shared-prefix attention: a batched decode step reads a prefix its rows share once, not once a row.

Agents that run at once on one box mostly start the same way: sub-agents, parallel tool
workers and a team's sessions send one system prompt and one tool list, then their own
turns. Every row of a pooled decode step (``kv/slots.py``) holds that prefix's keys/values in
its own slot, and one SDPA over the rows reads all of them: at 8 rows on a 620-token prefix
that is 8 copies of the same 620 tokens per layer, and on this CPU the step's attention is
bound by that read (it does 8x the bytes of one row for the same arithmetic).

Attention splits exactly over the keys (the softmax of a concatenation is the two softmaxes
reweighted by their log-sum-exps): the B rows' queries go together over the shared prefix,
read ONCE from the first row's slot (one call, B x G query positions per KV head), each
row's query over its own tokens past the prefix (one call with the step's padding mask), and
the two outputs are merged as ``lerp(own, prefix, sigmoid(lse_prefix - lse_own))``. The
prefix's keys/values in every row's slot are the same tensors up to fp32 rounding (same
tokens at the same positions, causal), so a row's output equals its full attention within
fp32 rounding (tests). Rows share a prefix only within one ``cache_salt`` (tenant).

The prefix half is arithmetic-bound (many queries, one read) while the full read is
bandwidth-bound, so the split only wins with enough rows and a long enough prefix. Measured
on this 2-core EPYC, 30 layers of SmolLM2-135M's attention (3 KV heads, 3 queries each),
64 own tokens a row, full -> split (``benchmarks/speed/shared_prefix_cpu.py``, results in
``benchmarks/results/shared_prefix_cpu.md``): 8 rows on 620 shared 16.1 -> 9.9 ms, on 2000
44.0 -> 22.1; 16 rows on 620 32.2 -> 18.1; 4 rows on 620 8.2 -> 7.1 but on 256 4.0 -> 4.6 (a
loss); 2 rows never gained. Hence ``worth_sharing``: at least ``MIN_ROWS`` rows and
``(rows - 1) x prefix >= MIN_SAVED`` tokens not read again.

CPU only: it needs the CPU flash kernel's log-sum-exp
(``aten._scaled_dot_product_flash_attention_for_cpu``); on CUDA each row reads its own copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from server.engines.hf.kv.slots import PooledStep

# a step shares its rows' common prefix with at least this many rows ...
MIN_ROWS = 4
# ... and at least this many prefix tokens a step does not read again ((rows - 1) x prefix)
MIN_SAVED = 1200

_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def shared_prefix_available(device: torch.device) -> bool:
    """Whether this torch build can split attention at a shared prefix on ``device``."""
    return device.type == "cpu" and _FLASH is not None


def worth_sharing(rows: int, prefix: int) -> bool:
    """Whether a step of ``rows`` rows gains by reading a ``prefix``-token shared prefix once."""
    return rows >= MIN_ROWS and (rows - 1) * prefix >= MIN_SAVED


def common_prefix(prompts: Sequence[Sequence[int]], salts: Sequence[str]) -> int:
    """Tokens every prompt starts with (0 if the rows are not one tenant's)."""
    if not prompts or len(set(salts)) != 1:
        return 0
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for other in prompts[1:]:
        i = 0
        while i < n and other[i] == first[i]:
            i += 1
        n = i
    return n


def shared_prefix_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, step: PooledStep, scaling: float | None
) -> torch.Tensor:
    """Attention of ``query`` [B, kv_heads, G, D] over the step's pool rows, its shared prefix read once.

    ``key`` / ``value`` [span, kv_heads, longest, D] are the step's pool rows; the first
    ``step.shared`` keys are read from row ``step.source`` only, and ``step.own_mask`` hides
    each row's padding past them. Returns [B, kv_heads, G, D].
    """
    assert _FLASH is not None
    batch, kv_heads, group, dim = query.shape
    prefix, src = step.shared, step.source
    together = query.transpose(0, 1).reshape(1, kv_heads, batch * group, dim)
    shared_k, shared_v = key[src : src + 1, :, :prefix], value[src : src + 1, :, :prefix]
    out_p, lse_p = _FLASH(together, shared_k, shared_v, scale=scaling)
    out_p = out_p.reshape(kv_heads, batch, group, dim).transpose(0, 1)
    lse_p = lse_p.reshape(kv_heads, batch, group).transpose(0, 1)
    own_k, own_v = key[:, :, prefix:], value[:, :, prefix:]
    out_o, lse_o = _FLASH(step.to_span(query), own_k, own_v, attn_mask=step.own_mask, scale=scaling)
    out_o, lse_o = step.from_span(out_o), step.from_span(lse_o)
    weight = torch.sigmoid(lse_p - lse_o).unsqueeze(-1).to(out_o.dtype)
    return torch.lerp(out_o, out_p, weight)
