"""KV tensors <-> prefix-cache blocks for the hf engine (transformers ``DynamicCache``).

A block's payload is one tensor [layers, 2, kv_heads, tokens, head_dim] (tokens =
block_size, or fewer for a tail). ``BlockCutter`` cuts blocks out of a prefilled cache;
``match_parts`` cuts a match's blocks to the tokens they serve (``KVSlots.restore`` copies
them straight into a slot), ``cached_kv`` concatenates them into one tensor on the device;
``cache_from_settings`` builds the cache from the settings section.
"""

from __future__ import annotations

from typing import Any

import torch

from server.kvcache.cost_model import CostModel
from server.kvcache.prefix_cache import MatchResult, PrefixCache
from server.kvcache.tier2 import make_store


class BlockCutter:
    """Cuts KV blocks out of a cache holding ``n_tokens`` tokens, all new full blocks at once.

    The first call copies every full block from there to the end with one stack per layer
    into [n_blocks, layers, 2, kv_heads, block, head_dim]; each block is then a clone of one
    row (one contiguous copy), so a block owns its memory and the byte budget stays exact.
    Cutting block by block instead (a stack over all layers per block) cost ~1 s per 32k
    tokens of an 8B shape on an H100. The partial last block (a tail) is cut on its own.
    """

    def __init__(self, kv: Any, block_size: int, n_tokens: int | None = None) -> None:
        self.kv, self.bs = kv, block_size
        self.n_tokens = kv.layers[0].keys.shape[2] if n_tokens is None else n_tokens
        self.first: int | None = None
        self.blocks: torch.Tensor | None = None

    def _stack(self, start: int, end: int) -> torch.Tensor:
        layers = [
            torch.stack((lay.keys[0, :, start:end], lay.values[0, :, start:end])) for lay in self.kv.layers
        ]
        return torch.stack(layers)  # [layers, 2, kv_heads, end-start, head_dim]

    def __call__(self, index: int) -> tuple[torch.Tensor, int]:
        start = index * self.bs
        if start + self.bs > self.n_tokens:  # the tail
            block = self._stack(start, self.n_tokens).contiguous()
            return block, block.numel() * block.element_size()
        if self.blocks is None or self.first is None or index < self.first:
            self.first = index
            n = (self.n_tokens - start) // self.bs
            stacked = self._stack(start, start + n * self.bs)
            L, two, H, _, D = stacked.shape
            self.blocks = stacked.view(L, two, H, n, self.bs, D).permute(3, 0, 1, 2, 4, 5)
        block = self.blocks[index - self.first].contiguous()  # a copy: the block owns its memory
        return block, block.numel() * block.element_size()


def match_parts(match: MatchResult) -> list[torch.Tensor]:
    """The match's blocks, each cut to the tokens it serves, where they are (tier 1 or 2)."""
    lengths = match.lengths or (match.block_size,) * len(match.blocks)
    return [b if n == b.shape[3] else b[:, :, :, :n] for b, n in zip(match.blocks, lengths, strict=True)]


def cached_kv(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """A match's parts (``match_parts``, at least one) as one tensor [layers, 2, kv_heads,
    cached_tokens, head_dim] on ``device``: a cache outside the ``KVSlots`` pool is filled from it
    layer by layer."""
    return torch.cat([p.to(device, non_blocking=True) for p in parts], dim=3)


def cache_from_settings(pc: Any, device_type: str) -> PrefixCache:
    """The prefix cache of a ``prefix_cache`` settings section (policy, tier 2, session cap)."""
    tier2 = getattr(pc, "tier2", None)
    store = None
    if tier2 is not None and pc.enabled:
        store = make_store(tier2.memory_mb, tier2.path, device_type)
    return PrefixCache(
        pc.block_size,
        pc.memory_mb * 2**20,
        enabled=pc.enabled,
        policy=getattr(pc, "policy", "lru"),
        tier2=store,
        cost=CostModel(getattr(tier2, "restore", "auto") if tier2 is not None else "auto"),
        session_cap_s=getattr(pc, "session_cap_s", 600.0),
    )
