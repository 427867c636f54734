"""Block-hash prefix cache (hf engine): reuse the KV of the longest cached chain of blocks.

A prompt is cut into blocks of ``block_size`` tokens. Block i is keyed by a chained
hash: H_i = blake2b(H_{i-1} || token ids of block i), H_{-1} = blake2b(salt), so a
key names the whole prefix up to and including that block (as in vLLM v1 and
nano-vllm). Only full blocks are cached; the partial tail is always recomputed.

Lookup walks the chain from the first block and stops at the first miss. Eviction is
LRU under a byte budget. On a hit the chain is touched from its last block to its
first, so within a chain the tail is the least recently used: eviction trims chains
from the end and never leaves a cached block whose parent is gone.

The cache stores opaque payloads with a byte size; the engine decides what a block's
KV is (for transformers: one tensor [layers, 2, kv_heads, block_size, head_dim]).
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MatchResult:
    """The cached chain for a prompt: ``len(blocks) * block_size`` tokens are served from cache."""

    hashes: tuple[bytes, ...]
    blocks: tuple[Any, ...]
    block_size: int

    @property
    def cached_tokens(self) -> int:
        return len(self.blocks) * self.block_size


@dataclass
class _Entry:
    payload: Any
    nbytes: int


class PrefixCache:
    def __init__(self, block_size: int, capacity_bytes: int, enabled: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.capacity_bytes = capacity_bytes
        self.enabled = enabled and capacity_bytes > 0
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()  # LRU first
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0

    # -- keys -----------------------------------------------------------------
    def block_hashes(self, token_ids: Sequence[int], salt: str = "") -> list[bytes]:
        """Chained hashes of every full block of ``token_ids``."""
        parent = hashlib.blake2b(salt.encode(), digest_size=16).digest()
        out: list[bytes] = []
        n_full = len(token_ids) // self.block_size
        for i in range(n_full):
            chunk = array("q", token_ids[i * self.block_size : (i + 1) * self.block_size]).tobytes()
            parent = hashlib.blake2b(parent + chunk, digest_size=16).digest()
            out.append(parent)
        return out

    # -- lookup ---------------------------------------------------------------
    def match(self, token_ids: Sequence[int], salt: str = "", max_blocks: int | None = None) -> MatchResult:
        """The longest cached chain of full blocks of ``token_ids`` (at most ``max_blocks``)."""
        if not self.enabled:
            return MatchResult((), (), self.block_size)
        hashes = self.block_hashes(token_ids, salt)
        if max_blocks is not None:
            hashes = hashes[:max_blocks]
        with self._lock:
            found: list[bytes] = []
            for h in hashes:
                if h not in self._entries:
                    break
                found.append(h)
            for h in reversed(found):  # tail first, so the head ends most recently used
                self._entries.move_to_end(h)
            blocks = tuple(self._entries[h].payload for h in found)
        return MatchResult(tuple(found), blocks, self.block_size)

    # -- insert ---------------------------------------------------------------
    def insert(
        self,
        token_ids: Sequence[int],
        salt: str,
        payload_for_block: Callable[[int], tuple[Any, int]],
    ) -> int:
        """Cache every full block of ``token_ids`` not cached yet; returns how many were added.

        ``payload_for_block(i)`` returns (payload, nbytes) for block i; it is only called
        for blocks not already cached, and not past the point where this prompt's chain
        alone would exceed the budget. The chain is then touched tail-first and LRU
        eviction brings the cache back under budget.
        """
        if not self.enabled:
            return 0
        hashes = self.block_hashes(token_ids, salt)
        added = 0
        chain_bytes = last_nbytes = 0
        kept: list[bytes] = []
        for i, h in enumerate(hashes):
            with self._lock:
                entry = self._entries.get(h)
            if entry is None:
                if chain_bytes + last_nbytes > self.capacity_bytes:
                    break  # blocks of one engine are the same size: the next one cannot fit
                payload, nbytes = payload_for_block(i)
                if chain_bytes + nbytes > self.capacity_bytes:
                    break
                entry = _Entry(payload, nbytes)
                with self._lock:
                    self._entries[h] = entry
                    self._bytes += nbytes
                added += 1
            chain_bytes += entry.nbytes
            last_nbytes = entry.nbytes
            kept.append(h)
        with self._lock:
            for h in reversed(kept):
                if h in self._entries:
                    self._entries.move_to_end(h)
            self._evict_locked()
        return added

    def _evict_locked(self) -> None:
        while self._bytes > self.capacity_bytes and self._entries:
            _, entry = self._entries.popitem(last=False)
            self._bytes -= entry.nbytes
            self.evictions += 1

    # -- introspection ----------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._entries

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
