"""The scheduler: which sequences the engine thread computes each turn (waiting → running → out).

One ``turn()`` of the engine loop (engine.py) is a prefill turn then a decode turn:

* ``prefill_turn``: up to one chunk (``runner.chunk_tokens``) of prompt tokens, taken from
  the request being prefilled and then from the waiting queue, in ONE forward (a row each,
  ``model/rows.py``); each whose prompt is complete joins ``running``; a prompt longer than
  what is left goes on next turn (``prefilling``). A burst of short prompts (sub-agents
  starting together) joins the batch in one turn instead of one per decode step, and a long
  prompt stalls the running requests by one chunk at most.
* ``decode_turn``: one token of every running request: each samples (``runner.pick``), then
  one batched forward of all that go on (``runner.forward``); the turn's chunks reach the
  event loop in one wake-up (outbox.py).

Every step on one sequence runs ``guarded``: a cancelled sequence's KV is kept for the
session's next turn and it leaves; an exception ends that request with an error chunk, never
the engine thread. Only the engine thread calls these (``waiting`` takes requests from any).
"""

from __future__ import annotations

import functools
import logging
import queue
from collections.abc import Callable
from typing import Any

from server.engines.base import drained
from server.engines.hf.outbox import one_wakeup
from server.engines.hf.runner import Runner
from server.engines.hf.sequence import SequenceState

log = logging.getLogger(__name__)


class Scheduler:
    """Waiting, prefilling and running sequences, and the turns that move them (see module doc)."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.waiting: queue.SimpleQueue[SequenceState] = queue.SimpleQueue()  # any thread puts
        self.prefilling: SequenceState | None = None  # the request whose prefill goes on next turn
        self.running: list[SequenceState] = []  # prefilled: one token each decode turn

    def add(self, seq: SequenceState) -> None:
        """Queue a request (any thread); the engine thread admits it on a coming prefill turn."""
        self.waiting.put(seq)

    def idle(self) -> bool:
        """Nothing to compute: no request running, being prefilled or waiting."""
        return not self.running and self.prefilling is None and self.waiting.empty()

    def turn(self) -> None:
        """One turn of the engine loop: a prefill turn, then a decode turn of the running requests."""
        self.prefill_turn()
        if self.running:
            self.decode_turn()
        self.running = [s for s in self.running if s.kv is not None]

    def prefill_turn(self) -> SequenceState | None:
        """Prefill up to one chunk's worth of prompt tokens, then the loop runs a decode turn.

        The tokens may span several queued requests, prefilled in ONE forward. Returns the
        request whose prefill goes on next turn (``prefilling``), if any.
        """
        runner = self.runner
        budget = runner.chunk_tokens
        group: list[tuple[SequenceState, list[int]]] = []
        if runner.slots is not None:  # a burst's rows in one growth of the pool (kv/slots.py)
            runner.slots.expect(len(self.running) + self.waiting.qsize() + (self.prefilling is not None))
        while budget > 0:
            if self.prefilling is None:
                try:
                    self.prefilling = self.waiting.get_nowait()
                except queue.Empty:
                    break
            seq = self.prefilling
            chunk = self.guarded(seq, functools.partial(runner.prefill_take, limit=budget))
            if chunk is None or seq.kv is None:  # cancelled or failed before its forward
                self.prefilling = None
                continue
            group.append((seq, chunk))
            budget -= max(1, len(chunk))
            if seq.prefill_at + len(chunk) < len(seq.request.prompt_ids):
                break  # its prefill goes on next turn
            self.prefilling = None
        if group:
            self._prefill_group(group)
        return self.prefilling

    def _prefill_group(self, group: list[tuple[SequenceState, list[int]]]) -> None:
        seqs = [seq for seq, _ in group]
        try:
            logits = self.runner.prefill_forward(seqs, [chunk for _, chunk in group])
        except Exception as exc:  # the group's forward failed: end those requests, keep the engine
            log.exception("prefill of %d requests failed", len(seqs))
            for seq in seqs:
                seq.fail(exc)
            return
        for i, (seq, chunk) in enumerate(group):
            end = functools.partial(self.runner.prefill_end, n=len(chunk), logits=logits[i])
            if self.guarded(seq, end) and seq.kv is not None:
                self.running.append(seq)

    def decode_turn(self) -> None:
        """One decode step of every running request: sample each, then one batched forward."""
        going = []
        with one_wakeup():  # the turn's tokens reach the event loop in one call (outbox.py)
            for seq in self.running:
                self.guarded(seq, self.runner.pick)
                if seq.kv is not None and seq.pending is not None:
                    going.append(seq)
        if not going:
            return
        try:
            self.runner.forward(going)
        except Exception as exc:  # the batch's forward failed: end those requests, keep the engine
            log.exception("decode step of %d requests failed", len(going))
            for seq in going:
                seq.fail(exc)

    def fail_all(self, exc: Exception) -> None:
        """The engine thread ends on ``exc``: every request it holds ends with an error chunk."""
        held = [*self.running, *([self.prefilling] if self.prefilling is not None else [])]
        self.running, self.prefilling = [], None
        for seq in held:
            seq.fail(exc)
        self.fail_waiting(exc)

    def fail_waiting(self, exc: Exception) -> None:
        """End the queued requests with an error chunk (any thread: the queue is thread-safe)."""
        for seq in drained(self.waiting):
            seq.fail(exc)

    def guarded(self, seq: SequenceState, step: Callable[[SequenceState], Any]) -> Any:
        """``step(seq)``, unless ``seq`` was cancelled (its KV kept, it leaves); an exception ends
        ``seq`` with an error chunk (never the engine thread). None when it did not run."""
        try:
            if seq.cancelled:
                self.runner.retain(seq)
                seq.kv = None
                return None
            return step(seq)
        except Exception as exc:  # never let one request kill the engine thread
            log.exception("request %s failed", seq.request.request_id)
            seq.fail(exc)
            return None
