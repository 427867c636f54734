"""``SeqState``: a request as the llamacpp engine thread holds it (slot, sampler, constraint, tokens)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from server.constrain.interface import TokenMatcher
from server.engines.base import GenerationChunk, GenerationRequest
from server.engines.hf.sampler import TokenSampler
from server.engines.llamacpp.outbox import Outbox
from server.engines.llamacpp.slots import Slot


@dataclass
class SeqState:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[GenerationChunk]
    constraint: TokenMatcher | None
    stop_ids: frozenset[int]
    sampler: TokenSampler
    outbox: Outbox
    slot: Slot | None = None
    cached_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    pending: int | None = None  # sampled, not yet in the KV
    done: bool = False
    cancelled: bool = False
    deferred: bool = False  # gave way to the running on a full pool: admitted again, counted once
    resume: list[int] | None = None  # preempted while running: the KV's tokens, computed again

    @property
    def prompt(self) -> list[int]:
        """What the slot must hold before the next decode: the prompt, or after a preemption the
        prompt and the reply so far (less the pending token, which is decoded next as before)."""
        return self.resume if self.resume is not None else self.request.prompt_ids

    def emit(self, chunk: GenerationChunk) -> None:
        """To the client's queue, through the outbox (outbox.py: the engine thread never wakes a loop)."""
        self.outbox.put(self, chunk)
