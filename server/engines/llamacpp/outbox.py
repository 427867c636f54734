"""The engine thread's chunks to the clients' event loops, handed over by a thread of its own.

Waking an event loop from another thread (``call_soon_threadsafe``: a write to its self-pipe)
hands the GIL to that loop, which then runs the client's code; the thread that woke it waits to
get the GIL back. Done by the engine thread between two ``llama_decode`` calls, that wait is
added to every token (profiled: 2-8 ms a token on this shared 2-core box, ~5-10% of a one-session
decode step of the embedded model). The engine thread instead puts its chunks here (a queue put,
no GIL handoff) and goes on into ``llama_decode``, which releases the GIL: the sender thread
wakes the loops while llama.cpp computes. It sends what has queued up in one call a loop, so a
turn of 8 running requests wakes a loop once, not 8 times. Chunks keep their order.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Protocol

from server.engines.base import GenerationChunk, drained

log = logging.getLogger(__name__)


class Receiver(Protocol):
    """A request's end of the outbox: its event loop and queue; ``cancelled`` once the loop is gone."""

    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[GenerationChunk]
    cancelled: bool


def deliver(batch: list[tuple[Receiver, GenerationChunk]]) -> None:
    """On the receivers' event loop: each chunk into its request's queue."""
    for seq, chunk in batch:
        seq.out.put_nowait(chunk)


class Outbox:
    """A sender thread (``start``/``stop``) and its queue of (receiver, chunk)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Receiver, GenerationChunk] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.wakes = 0  # call_soon_threadsafe calls made (a test counts them)

    def put(self, seq: Receiver, chunk: GenerationChunk) -> None:
        """Any thread; never blocks and never hands the GIL to an event loop."""
        self._queue.put((seq, chunk))

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="llamacpp-outbox", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Send what is queued, then end the thread (call after the engine thread has ended)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            items = [first, *drained(self._queue)]
            self._send([it for it in items if it is not None])
            if None in items:
                return

    def _send(self, items: list[tuple[Receiver, GenerationChunk]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Receiver, GenerationChunk]]] = {}
        for seq, chunk in items:
            by_loop.setdefault(seq.loop, []).append((seq, chunk))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(deliver, batch)
                self.wakes += 1
            except RuntimeError:  # the client's event loop is gone: nobody to tell
                for seq, _ in batch:
                    seq.cancelled = True
            except Exception:  # never let the sender die: every later chunk would be lost
                log.exception("the llamacpp outbox could not wake an event loop")
