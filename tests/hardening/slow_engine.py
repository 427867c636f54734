"""A scripted engine that writes slowly: one token per step, and records when each request ended.

For the cancellation tests: an interrupt or a client that leaves must close the engine request
(``closed_at`` set, ``finished`` False) within a step or so of the event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from server.engines.base import GenerationChunk, GenerationRequest
from tests.engines.fake import ScriptedEngine


@dataclass
class Run:
    """One engine request: decode steps done, and when (monotonic) the engine let it go."""

    steps: int = 0
    finished: bool = False  # ran to its end (max_tokens)
    closed_at: float | None = None


class SlowEngine(ScriptedEngine):
    name = "slow-scripted"

    def __init__(self, tokenizer: Any, step_s: float = 0.02, prefill_s: float = 0.0, burst: int = 1) -> None:
        super().__init__(tokenizer, reply=" one two three four five six seven eight")
        self.step_s, self.prefill_s = step_s, prefill_s
        self.burst = burst  # tokens per step (a bigger chunk, as a multi-token decode step)
        self.runs: list[Run] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        run = Run()
        self.runs.append(run)
        n = request.sampling.max_tokens
        try:
            await asyncio.sleep(self.prefill_s)
            for i in range(0, n, self.burst):
                await asyncio.sleep(self.step_s)
                run.steps += 1
                ids = [self.reply_ids[j % len(self.reply_ids)] for j in range(i, min(n, i + self.burst))]
                yield GenerationChunk(ids, 0, "length" if i + self.burst >= n else None)
            run.finished = True
        finally:
            run.closed_at = time.monotonic()

    def wait_closed(self, index: int = 0, timeout_s: float = 5.0) -> Run:
        """The run once the engine let it go (polls from the test's thread)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.runs) > index and self.runs[index].closed_at is not None:
                return self.runs[index]
            time.sleep(0.01)
        raise AssertionError(f"engine request {index} still running after {timeout_s} s: {self.runs}")
