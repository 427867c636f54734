"""Chunks from the engine thread to the requests' event loops: one wake-up a decode turn, not one a token.

``loop.call_soon_threadsafe`` writes to the loop's self-pipe and wakes its thread; a decode
turn of 8 sessions emitted 8 chunks, so 8 wake-ups, each taking the event loop's thread
through a pass of its own while the engine's OpenMP threads hold both cores (2-core box).
Inside ``one_wakeup()`` the engine thread's chunks wait in a list and go to each loop in ONE
call when it ends, each to its request's queue, in the order they were emitted. Outside it
(prefill, errors, other threads) a chunk goes at once, as before.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

Item = tuple[asyncio.Queue[Any], Any]
_held = threading.local()  # this thread's chunks waiting for the end of its one_wakeup(), or None


def send(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any], chunk: Any) -> None:
    """Put ``chunk`` on ``queue`` (of ``loop``): now, or with the rest at the end of ``one_wakeup()``."""
    held: dict[asyncio.AbstractEventLoop, list[Item]] | None = getattr(_held, "by_loop", None)
    if held is None:
        loop.call_soon_threadsafe(queue.put_nowait, chunk)
    else:
        held.setdefault(loop, []).append((queue, chunk))


def _deliver(items: list[Item]) -> None:
    for queue, chunk in items:
        queue.put_nowait(chunk)


def flush() -> None:
    """Send what this thread holds now (a request's last chunk before its KV is cached), hold on."""
    held: dict[asyncio.AbstractEventLoop, list[Item]] | None = getattr(_held, "by_loop", None)
    if not held:
        return
    for loop, items in list(held.items()):
        try:
            loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # that loop is closed: nobody is left to read these chunks
            log.debug("dropped %d chunks for a closed event loop", len(items))
    held.clear()


@contextmanager
def one_wakeup() -> Iterator[None]:
    """Hold this thread's chunks until the block ends, then wake each event loop once."""
    _held.by_loop = {}
    try:
        yield
    finally:
        flush()
        _held.by_loop = None
