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

    def emit(self, chunk: GenerationChunk) -> None:
        """To the client's queue, through the outbox (outbox.py: the engine thread never wakes a loop)."""
        self.outbox.put(self, chunk)
