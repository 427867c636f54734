"""The engine loop's prefill turn: which queued prompts get computed now, in one forward.

Each turn of the engine loop (engine.py) prefills up to one chunk (``chunk_tokens``) of
prompt tokens, then runs one decode step of every running request. The chunk's tokens may
come from several queued requests: their next pieces go through ONE forward, a row each
(``SequenceSteps.prefill_forward``, batched_prefill.py), and each that is complete joins
the running batch. A prompt longer than what is left goes on next turn.
"""

from __future__ import annotations

import functools
import logging
import queue
from typing import TYPE_CHECKING

from server.engines.hf.runner import SequenceState

if TYPE_CHECKING:
    from server.engines.hf.engine import HFEngine

log = logging.getLogger(__name__)


def prefill_turn(engine: HFEngine, prefilling: SequenceState | None) -> SequenceState | None:
    """Prefill up to one chunk's worth of prompt tokens, then the loop runs a decode step.

    The tokens may span several queued requests, prefilled in ONE forward (a row each,
    batched_prefill.py): a burst of short prompts (sub-agents starting together) joins
    the batch in one turn instead of one per decode step, and a long prompt still stalls
    the running requests by one chunk at most. Returns the request whose prefill goes on
    next turn, if any.
    """
    budget = engine.steps.chunk_tokens
    group: list[tuple[SequenceState, list[int]]] = []
    if engine.steps.slots is not None:  # a burst's rows in one growth of the pool (kv_slots.py)
        engine.steps.slots.expect(len(engine._running) + engine._inbox.qsize() + (prefilling is not None))
    while budget > 0:
        if prefilling is None:
            try:
                prefilling = engine._inbox.get_nowait()
            except queue.Empty:
                break
        seq = prefilling
        chunk = engine._run_guarded(seq, functools.partial(engine.steps.prefill_take, limit=budget))
        if chunk is None or seq.kv is None:  # cancelled or failed before its forward
            prefilling = None
            continue
        group.append((seq, chunk))
        budget -= max(1, len(chunk))
        if seq.prefill_at + len(chunk) < len(seq.request.prompt_ids):
            break  # its prefill goes on next turn
        prefilling = None
    if group:
        _prefill_group(engine, group)
    return prefilling


def _prefill_group(engine: HFEngine, group: list[tuple[SequenceState, list[int]]]) -> None:
    seqs = [seq for seq, _ in group]
    try:
        logits = engine.steps.prefill_forward(seqs, [chunk for _, chunk in group])
    except Exception as exc:  # the group's forward failed: end those requests, keep the engine
        log.exception("prefill of %d requests failed", len(seqs))
        for seq in seqs:
            engine._fail(seq, exc)
        return
    for i, (seq, chunk) in enumerate(group):
        end = functools.partial(engine.steps.prefill_end, n=len(chunk), logits=logits[i])
        if engine._run_guarded(seq, end) and seq.kv is not None:
            engine._running.append(seq)
