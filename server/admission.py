"""Admission control at the front door: bounded concurrency and a bounded queue.

At most ``max_running`` requests generate at once; up to ``max_queued`` more wait
in arrival order; anything beyond is refused at once with HTTP 429 and a
Retry-After, so an overloaded worker sheds load instead of timing everyone out.

``reserve()`` counts a request in (or refuses it); the returned ticket then waits for
a running slot. A ticket is released exactly once: explicitly when the request ends,
or when it is garbage-collected (a stream whose client vanished before it began).
"""

from __future__ import annotations

import asyncio

from server.errors import Overloaded


class Ticket:
    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._held = False
        self._released = False

    async def acquire(self) -> None:
        await self._admission._slots.acquire()
        self._held = True

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._held:
            self._admission._slots.release()
        self._admission.inside -= 1

    def __del__(self) -> None:
        self.release()


class Admission:
    def __init__(self, max_running: int, max_queued: int) -> None:
        self.max_running = max_running
        self.max_queued = max_queued
        self._slots = asyncio.Semaphore(max_running)
        self.inside = 0  # running + waiting
        self.rejected = 0

    def reserve(self) -> Ticket:
        if self.inside >= self.max_running + self.max_queued:
            self.rejected += 1
            raise Overloaded(
                f"server busy: {self.max_running} requests running and {self.max_queued} queued "
                f"(limits.max_concurrent_requests / limits.max_queued_requests); retry shortly",
                retry_after_s=1,
            )
        self.inside += 1
        return Ticket(self)
