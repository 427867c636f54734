"""Apply a batch of token constraints to logits [B, V] on CPU or CUDA, batched.

Every constrained row fills its row of one packed int32 bitmask [B, ceil(V/32)] (kept on
the CPU: the constraints write it with numpy), the bitmask is copied to the logits'
device once, and ``xgrammar.apply_token_bitmask_inplace`` masks all constrained rows in
one call (a C++ kernel on CPU, a CUDA/Triton kernel or a torch fallback on GPU).
Unconstrained rows (``None``) are left untouched. Never a Python loop over the vocabulary.

Two entry points:

* ``MaskApplier.apply(logits, constraints)`` — for a custom decode loop that calls
  ``constraint.accept_token`` itself after sampling (the hf engine);
* ``ConstraintLogitsProcessor`` — a ``transformers`` logits processor for ``generate()``:
  it feeds each row's previously sampled token (the last of ``input_ids``) to its
  constraint before masking the next step. A rejected token puts the constraint in its
  error state, whose mask allows only end of sequence, so generation ends; read
  ``constraint.error`` afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import xgrammar as xgr

from server.masking.interface import TokenConstraint


class MaskApplier:
    """Holds the reusable host (and device) bitmask buffers for one engine."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._host: torch.Tensor | None = None
        self._device: dict[torch.device, torch.Tensor] = {}

    def _buffer(self, batch: int, pin: bool) -> torch.Tensor:
        if self._host is None or self._host.shape[0] < batch:
            host = torch.full((max(batch, 8), self.words), -1, dtype=torch.int32)
            self._host = host.pin_memory() if pin else host
        return self._host

    def fill(
        self, constraints: Sequence[TokenConstraint | None], pin: bool = False
    ) -> tuple[torch.Tensor, list]:
        """Fill the rows of the constrained requests; returns (bitmask[:B], constrained row indices)."""
        bitmask = self._buffer(len(constraints), pin)
        rows = []
        for i, c in enumerate(constraints):
            if c is not None:
                c.fill_next_token_bitmask(bitmask, i)
                rows.append(i)
        return bitmask[: len(constraints)], rows

    def apply(self, logits: torch.Tensor, constraints: Sequence[TokenConstraint | None]) -> torch.Tensor:
        """Mask ``logits`` in place (disallowed tokens → -inf) and return it."""
        if logits.shape[0] != len(constraints):
            raise ValueError(f"{logits.shape[0]} rows of logits but {len(constraints)} constraints")
        cuda = logits.device.type == "cuda"
        bitmask, rows = self.fill(constraints, pin=cuda)
        if not rows:
            return logits
        if cuda:
            dev = self._device.get(logits.device)
            if dev is None or dev.shape[0] < bitmask.shape[0]:
                dev = self._device[logits.device] = torch.empty_like(self._host, device=logits.device)
            dev = dev[: bitmask.shape[0]]
            dev.copy_(bitmask, non_blocking=True)
            bitmask = dev
        indices = None if len(rows) == len(constraints) else rows
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size, indices=indices)
        return logits


class ConstraintLogitsProcessor:
    """``transformers`` LogitsProcessor: one constraint (or None) per batch row."""

    def __init__(self, constraints: Sequence[TokenConstraint | None], vocab_size: int) -> None:
        self.constraints = list(constraints)
        self.applier = MaskApplier(vocab_size)
        self._started = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._started:
            last = input_ids[:, -1].tolist()
            for c, tok in zip(self.constraints, last, strict=True):
                if c is not None and not c.is_terminated():
                    c.accept_token(tok)
        self._started = True
        return self.applier.apply(scores, self.constraints)
