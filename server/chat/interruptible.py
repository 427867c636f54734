"""A stream the client can stop mid-way: ``Interruptible`` passes a source's items until an event is
set, then closes the source where it waits -- also while the engine works on a prefill or a decode step --
so the engine request is cancelled at once (the hf engine drops it before its next decode step).
The caller then finishes the reply from what was generated (``finish_reason: "interrupted"``, real
usage). Used by the Responses WebSocket's ``response.interrupt`` (server/api/ws_interrupt.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")
INTERRUPTED = "interrupted"  # the finish reason of a reply the client stopped


class Interruptible:
    """``items(source)``: the source's items until ``stop`` is set; then the source is closed
    (cancelled where it waits) and ``cut`` is True. A source that ended first is not cut."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.cut = False

    async def items(self, source: AsyncIterator[T]) -> AsyncIterator[T]:
        stopped = asyncio.ensure_future(self.stop.wait())
        step: asyncio.Future[T] | None = None
        try:
            while True:
                if self.stop.is_set():
                    self.cut = True
                    return
                step = asyncio.ensure_future(anext(source))
                await asyncio.wait((step, stopped), return_when=asyncio.FIRST_COMPLETED)
                if not step.done():  # stopped while the source works: cancel it where it waits
                    self.cut = True
                    return
                try:
                    item = step.result()
                except StopAsyncIteration:
                    return
                yield item
        finally:  # also when this stream is cancelled (the client left) or closed early
            stopped.cancel()
            if step is not None and not step.done():
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)
            await source.aclose()  # type: ignore[attr-defined]
