"""The llamacpp engine's tier 2: the KV of idle slots evicted from the pool, kept whole, restored on return.

When the pool (cells) or the slot table (sequence ids) is full, the least recently used idle
slot goes; with tier 2 on, its state first goes to a ``Tier2Store`` (host RAM, or a folder with
``prefix_cache.tier2.path``: ``server/kvcache/tier2.py``, the hf engine's stores, with their byte
budget, least recently stored dropped first, and their checks). A saved state is llama.cpp's own
serialization of one sequence (``llama_state_seq_get_data``: its cells' K and V, positions and
tokens), keyed by the chained hash of (namespace, the tokens it holds), as the hf engine keys a block.

A new prompt whose longest saved prefix is longer than what any slot in the pool holds gets that
state loaded into its slot (``llama_state_seq_set_data``) and trimmed to the shared prefix: a copy
of KV bytes in place of a forward pass over those tokens. An entry taken back leaves the store (it
is in the pool again; evicted again, it is saved again). An entry whose tokens are a prefix of a
newer entry's of the same namespace is dropped when the newer one is saved: it holds nothing more.

Pure Python over the store (no llama_cpp): the scheduler calls the runtime's ``seq_save`` /
``seq_load``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from server.engines.llamacpp.slots import common_length
from server.kvcache.block_keys import chain_key, root_key
from server.kvcache.tier2 import Tier2Store


def default_budget_mb() -> int:
    """Tier 2 when ``prefix_cache.tier2.memory_mb`` is unset: host RAM, llama-server's default
    prompt cache (``--cache-ram 8192``) or a quarter of physical memory, the smaller."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        physical = 0
    return min(8192, physical // 4 // 2**20) if physical > 0 else 8192


@dataclass(frozen=True)
class Saved:
    """One saved slot: its key in the store, its namespace and the tokens its KV holds."""

    key: bytes
    salt: str
    tokens: tuple[int, ...]


class SavedSlots:
    """The index of the states in a ``Tier2Store`` (None: tier 2 is off and nothing is saved)."""

    def __init__(self, store: Tier2Store | None) -> None:
        self.store = store
        self._index: dict[bytes, Saved] = {}
        self.saved_tokens = 0
        self.restored_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.store is not None and self.store.enabled

    def __len__(self) -> int:
        return len(self._index)

    def save(self, salt: str, tokens: list[int], state: torch.Tensor) -> None:
        """Keep ``state`` (the KV of ``tokens`` in namespace ``salt``); the store may drop older ones."""
        if self.store is None or not self.store.enabled or not tokens:
            return
        held = tuple(tokens)
        for old in list(self._index.values()):  # superseded: everything it holds, this one holds
            n = len(old.tokens)
            if old.salt == salt and n <= len(held) and common_length(old.tokens, held) == n:
                self.store.discard(old.key)
                del self._index[old.key]
        parent = root_key(salt)
        if self._keep(Saved(chain_key(parent, held), salt, held), state):
            self.saved_tokens += len(held)

    def put_back(self, entry: Saved, state: torch.Tensor) -> None:
        """A state ``take`` returned goes back as it was (its load failed, or the prompt used only
        part of it): the same key, not counted as a new save."""
        if self.store is not None and self.store.enabled:
            self._keep(entry, state)

    def _keep(self, entry: Saved, state: torch.Tensor) -> bool:
        assert self.store is not None
        dropped = self.store.put(entry.key, root_key(entry.salt), entry.tokens, state, owned=True)
        for gone in dropped:  # the store made room (or could not fit this one)
            self._index.pop(gone, None)
        if entry.key in dropped:
            return False
        self._index[entry.key] = entry
        return True

    def best(self, prompt: list[int], salt: str) -> tuple[Saved | None, int]:
        """The saved state sharing the longest prefix with ``prompt`` (at most ``len(prompt) - 1``)."""
        best, n_best = None, 0
        limit = len(prompt) - 1  # the last prompt token is always computed: its logits are needed
        held = tuple(prompt)  # tuples both sides: slices compare in C (common_length)
        for entry in self._index.values():
            if entry.salt != salt:
                continue
            n = min(common_length(entry.tokens, held), limit)
            if n > n_best:
                best, n_best = entry, n
        return best, n_best

    def take(self, entry: Saved) -> torch.Tensor | None:
        """The state of ``entry``, removed from the store; None when the store lost or rejected it."""
        self._index.pop(entry.key, None)
        if self.store is None:
            return None
        return self.store.get(entry.key, root_key(entry.salt), entry.tokens)
