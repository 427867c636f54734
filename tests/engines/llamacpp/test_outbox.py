"""The llamacpp engine's outbox: chunks in order, one wake a loop for what has queued up."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from server.engines.base import GenerationChunk
from server.engines.llamacpp.outbox import Outbox
from tests.engines.vllm.conftest import Loop


@dataclass
class Seq:
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[GenerationChunk] = field(default_factory=asyncio.Queue)
    cancelled: bool = False


def test_what_has_queued_up_wakes_each_loop_once_and_keeps_its_order():
    loops = [Loop(), Loop()]
    seqs = [Seq(loops[i % 2].loop) for i in range(4)]
    box = Outbox()
    for step in range(5):  # queued before the sender starts: one send of all 20
        for i, seq in enumerate(seqs):
            box.put(seq, GenerationChunk([100 * i + step], 0))
    box.start()
    box.stop()  # sends what is queued, then ends
    for lp in loops:
        lp.close()
    assert box.wakes == 2  # one a loop, not one a chunk (20)
    for i, seq in enumerate(seqs):
        got = [seq.out.get_nowait().token_ids[0] for _ in range(seq.out.qsize())]
        assert got == [100 * i + step for step in range(5)]


def test_a_closed_loop_cancels_its_requests_and_the_sender_goes_on():
    gone = asyncio.new_event_loop()
    gone.close()
    live = Loop()
    dead_seq, live_seq = Seq(gone), Seq(live.loop)
    box = Outbox()
    box.start()
    box.put(dead_seq, GenerationChunk([1], 0))
    box.put(live_seq, GenerationChunk([2], 0))
    box.stop()
    live.close()
    assert dead_seq.cancelled and not live_seq.cancelled
    assert live_seq.out.get_nowait().token_ids == [2]
