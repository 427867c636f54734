"""Bitmask application, for both engines (the hf engine and vLLM's processor).

* ``write_row`` — one row of a packed bitmask, wherever the bitmask lives.
* ``pack_ids`` — a packed int32 row (xgrammar's format) allowing exactly the given ids.
* ``MaskApplier`` — one packed int32 bitmask [B, ceil(V/32)] on the host (the constraints
  write it with numpy), copied to the logits' device once, and applied to every
  constrained row with one ``xgrammar.apply_token_bitmask_inplace`` call (a C++ kernel on
  CPU, a CUDA/Triton kernel or a torch fallback on GPU). Unconstrained rows are left
  untouched. Never a Python loop over the vocabulary. On a GPU two host buffers are
  used in turn: a step's host-to-device copy may still be queued behind the forward pass
  while the CPU fills the next step's mask.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from server.constrain.interface import TokenMatcher


def write_row(bitmask: Any, index: int, row: np.ndarray) -> None:
    """Set row ``index`` of a packed bitmask (numpy, a CPU tensor or a device tensor) to ``row``."""
    if isinstance(bitmask, np.ndarray):
        bitmask[index] = row
    elif bitmask.device.type == "cpu":
        bitmask.numpy()[index] = row
    else:  # one host-to-device copy
        bitmask[index].copy_(torch.from_numpy(row))


class RowWriter:
    """``write_row`` for a matcher that fills every step: the numpy view of a CPU bitmask is kept
    (engines reuse one buffer), so a step costs one row copy."""

    __slots__ = ("_bitmask", "_view")

    def __init__(self) -> None:
        self._bitmask: Any = None
        self._view: Any = None

    def write(self, bitmask: Any, index: int, row: np.ndarray) -> None:
        if bitmask is not self._bitmask:
            self._bitmask = bitmask
            cpu = isinstance(bitmask, np.ndarray) or bitmask.device.type == "cpu"
            self._view = bitmask if isinstance(bitmask, np.ndarray) else bitmask.numpy() if cpu else None
        if self._view is not None:
            self._view[index] = row
        else:  # a device bitmask: one host-to-device copy
            bitmask[index].copy_(torch.from_numpy(row))


def pack_ids(ids: Iterable[int], vocab_size: int) -> np.ndarray:
    """int32[ceil(V/32)] with bit j of word i set for each id 32*i+j in ``ids`` (others ignored)."""
    words = (vocab_size + 31) // 32
    bits = np.zeros(words * 32, dtype=bool)
    bits[[t for t in ids if 0 <= t < vocab_size]] = True
    return np.packbits(bits, bitorder="little").view("<u4").view(np.int32).copy()


class MaskApplier:
    """Holds the reusable host (and device) bitmask buffers for one engine."""

    def __init__(self, vocab_size: int, capacity: int = 8, pin: bool = False) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._capacity = capacity
        self._pin = pin
        self._host: list[torch.Tensor] = []
        self._turn = 0
        self._device: dict[tuple[torch.device, int], torch.Tensor] = {}

    def buffer(self, batch: int, turns: int = 1) -> torch.Tensor:
        """A host bitmask of ``batch`` rows (contents undefined); ``turns`` buffers used in rotation."""
        while len(self._host) < turns:
            self._host.append(self._alloc(max(batch, self._capacity)))
        self._turn = (self._turn + 1) % turns
        host = self._host[self._turn]
        if host.shape[0] < batch:
            host = self._host[self._turn] = self._alloc(max(batch, 2 * host.shape[0]))
        return host

    def _alloc(self, rows: int) -> torch.Tensor:
        host = torch.full((rows, self.words), -1, dtype=torch.int32)
        return host.pin_memory() if self._pin else host

    def fill(
        self, constraints: Sequence[TokenMatcher | None], pin: bool = False
    ) -> tuple[torch.Tensor, list[int]]:
        """Fill the rows of the constrained requests; returns (bitmask[:B], constrained row indices)."""
        if pin and not self._pin and self._host:
            self._host.clear()  # reallocate pinned
        self._pin = self._pin or pin
        bitmask = self.buffer(len(constraints))
        rows: list[int] = []
        for i, c in enumerate(constraints):
            if c is not None:
                c.fill_next_token_bitmask(bitmask, i)
                rows.append(i)
        return bitmask[: len(constraints)], rows

    def apply_rows(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """Mask ``logits[rows]`` in place by the same rows of the host ``bitmask``; return ``logits``."""
        if not rows:
            return logits
        if logits.device.type != "cpu":
            key = (logits.device, self._turn)
            dev = self._device.get(key)
            if dev is None or dev.shape[0] < bitmask.shape[0]:
                dev = self._device[key] = torch.empty(
                    (max(bitmask.shape[0], self._capacity), self.words),
                    dtype=torch.int32,
                    device=logits.device,
                )
            dev = dev[: bitmask.shape[0]]
            dev.copy_(bitmask, non_blocking=True)
            bitmask = dev
        indices = None if len(rows) == logits.shape[0] else rows
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size, indices=indices)
        return logits

    def apply(self, logits: torch.Tensor, constraints: Sequence[TokenMatcher | None]) -> torch.Tensor:
        """Mask ``logits`` in place (disallowed tokens → -inf) and return it."""
        if logits.shape[0] != len(constraints):
            raise ValueError(f"{logits.shape[0]} rows of logits but {len(constraints)} constraints")
        bitmask, rows = self.fill(constraints, pin=logits.device.type == "cuda")
        return self.apply_rows(logits, bitmask, rows)
