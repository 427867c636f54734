"""What the llamacpp engine hands its runtime: rows of one batch, and the runtime's one refusal.

Pure Python (no llama_cpp): the engine and its tests build batches without the library;
``runtime.py`` turns them into a ``llama_batch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class Row:
    """One token of a batch: its id, position, sequence, and whether its logits are wanted."""

    token: int
    pos: int
    seq: int
    logits: bool = False


class KVFull(RuntimeError):
    """No room in the KV cache for the batch (llama_decode returned 1); nothing was computed."""


class Runtime(Protocol):
    """What the engine uses of a runtime (``runtime.LlamaRuntime``; tests pass a fake)."""

    n_vocab: int
    n_ctx_train: int
    n_ctx: int

    def kv_bytes_per_token(self) -> int: ...
    def open(self, n_ctx: int, n_seq: int, n_batch: int) -> None: ...
    def seq_copy(self, src: int, dst: int, n: int) -> None: ...
    def seq_trim(self, seq: int, n: int) -> None: ...
    def seq_save(self, seq: int) -> torch.Tensor: ...
    def seq_load(self, seq: int, state: torch.Tensor) -> bool: ...
    def decode(self, rows: list[Row]) -> list[int]: ...
    def logits(self, i: int) -> torch.Tensor: ...
    def close(self) -> None: ...
