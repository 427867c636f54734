"""Token constraints in a ``transformers`` ``generate()`` loop: ``ConstraintLogitsProcessor``.

A ``transformers`` logits processor for ``generate()`` (no engine of ours uses it: the hf
engine masks in its own decode loop with ``bitmask.MaskApplier``). It feeds each row's
previously sampled token (the last of ``input_ids``) to its constraint before masking the next
step. A rejected token puts the constraint in its error state, whose mask allows only end of
sequence, so generation ends; read ``constraint.error`` afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from server.constrain.bitmask import MaskApplier
from server.constrain.interface import TokenMatcher


class ConstraintLogitsProcessor:
    """``transformers`` LogitsProcessor: one constraint (or None) per batch row."""

    def __init__(self, constraints: Sequence[TokenMatcher | None], vocab_size: int) -> None:
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
