"""A request as the engine thread holds it: its KV, next logits, sampler, constraint, tokens so far.

The scheduler (scheduler.py) moves ``SequenceState``s from waiting to running and out; the
runner (runner.py) fills them in (prefill, pick, forward, finish). ``emit`` sends a chunk to
the request's event loop (outbox.py); ``fail`` ends the sequence with an error chunk.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from server.constrain.interface import TokenMatcher
from server.engines.base import GenerationChunk, GenerationRequest, engine_error
from server.engines.hf.outbox import send
from server.engines.hf.sampler import TokenSampler


@dataclass
class SequenceState:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[GenerationChunk]
    cancelled: bool = False
    kv: DynamicCache | None = None
    next_logits: torch.Tensor | None = None  # logits for the next token, [V]
    cached_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    sampler: TokenSampler | None = None  # built at prefill, on the engine thread (bias, penalties, seed)
    constraint: TokenMatcher | None = None  # request.constraint's matcher (compiled by chat)
    stop_ids: frozenset[int] = frozenset()  # the model's EOS ids + the request's stop_token_ids
    prefill_at: int = -1  # next prompt position to prefill (-1: prefill not begun)
    prefill_t0: float = 0.0
    pending: int | None = None  # the token sampled this step, to run through the model next

    def emit(self, chunk: GenerationChunk) -> None:
        send(self.loop, self.out, chunk)  # at once, or with the decode turn's others (outbox.py)

    def fail(self, exc: Exception) -> None:
        """End with an error chunk that names the exception (the engine goes on)."""
        self.kv = None
        self.emit(GenerationChunk([], self.cached_tokens, "error", engine_error(exc)))
