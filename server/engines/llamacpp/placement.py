"""Where a request's KV starts in the llamacpp pool, and where an idle slot's KV goes.

``place``: a claimed slot starts from the longer of what the pool holds (a copy from the claim's
source, or the slot's own KV trimmed) and what tier 2 saved (loaded, then trimmed to the shared
prefix). ``evict``: an idle slot's KV leaves the pool, saved to tier 2 first when it is on.
``spill_idle``: with tier 2 on, every idle slot goes there once new requests have claimed theirs.
Runs on the engine thread only (scheduler.py calls it).
"""

from __future__ import annotations

import torch

from server.engines.llamacpp.batch import Runtime
from server.engines.llamacpp.slots import Claim, Evicted, SlotTable
from server.engines.llamacpp.tier2 import SavedSlots


class KVPlacement:
    def __init__(self, rt: Runtime, slots: SlotTable, saved: SavedSlots) -> None:
        self.rt = rt
        self.slots = slots
        self.saved = saved

    def place(self, claim: Claim, prompt: list[int], salt: str) -> int:
        """The claimed slot's starting KV, in the pool; returns how many prompt tokens it holds.

        The longer of: what the claim found in the pool (a copy from ``source``, or the slot's own
        KV trimmed), and a state tier 2 saved (loaded, then trimmed to the shared prefix)."""
        slot, tried = claim.slot, False
        entry, n = self.saved.best(prompt, salt)
        state = self.saved.take(entry) if entry is not None and n > claim.cached else None
        if entry is not None and state is not None:
            tried = True
            loaded = self.load(slot.seq, state)
            # no room even with every idle slot gone, or the prompt parts from it: it stays saved (no copy)
            if not loaded or n < len(entry.tokens):
                self.saved.put_back(entry, state)
            if loaded:
                self.rt.seq_trim(slot.seq, n)
                slot.tokens = list(prompt[:n])
                self.saved.restored_tokens += n
                return n
        source = claim.source
        if source is not None and source.tokens[: claim.cached] == prompt[: claim.cached]:
            self.rt.seq_trim(slot.seq, 0)
            self.rt.seq_copy(source.seq, slot.seq, claim.cached)
            return claim.cached
        if source is None and not tried:  # the slot's own KV (a failed load cleared it)
            self.rt.seq_trim(slot.seq, claim.cached)
            return claim.cached
        self.rt.seq_trim(slot.seq, 0)  # what the claim counted on was evicted to make room
        slot.tokens = []
        return 0

    def load(self, seq: int, state: torch.Tensor) -> bool:
        """Load a saved state into sequence ``seq``, evicting idle slots while the pool has no room."""
        while not self.rt.seq_load(seq, state):
            gone = self.slots.evict_one()
            if gone is None:
                return False
            self.evict(gone)
        return True

    def evict(self, gone: Evicted) -> None:
        """An idle slot's KV leaves the pool: saved to tier 2 first (when it is on), then cleared."""
        if self.saved.enabled and gone.tokens:
            self.saved.save(gone.salt, gone.tokens, self.rt.seq_save(gone.seq))
        self.rt.seq_trim(gone.seq, 0)

    def spill_idle(self) -> None:
        """With tier 2 on, every idle slot's KV leaves the pool for tier 2 (as llama-server's
        ``--cache-idle-slots``). Idle cells cost every later batch: a batch attends over the pool's
        used range, up to its highest cell in use, and checks each idle cell there against each
        row's mask; a copy to host RAM and back costs milliseconds. Saved in the order eviction
        would take them: tier 2 drops the first saved first when it runs out of room."""
        if not self.saved.enabled:
            return
        while (gone := self.slots.evict_one()) is not None:
            self.evict(gone)
