"""Admission control at the front door: bounded concurrency and a bounded queue.

At most ``max_running`` requests generate at once; up to ``max_queued`` more wait
in arrival order; anything beyond is refused at once with HTTP 429 and a
Retry-After, so an overloaded worker sheds load instead of timing everyone out.

A tenant (an API key, or the one shared tenant without keys) holds at most ``tenant_share`` of
those places (running + waiting): past it that tenant's requests are the 429s, not the others'.

``reserve(tenant)`` counts a request in (or refuses it); the returned ticket then waits for
a running slot. A ticket is released exactly once: explicitly when the request ends,
or when it is garbage-collected (a stream whose client vanished before it began).
"""

from __future__ import annotations

import asyncio
import math

from server.errors import Overloaded


class Ticket:
    def __init__(self, admission: Admission, tenant: str = "") -> None:
        self._admission = admission
        self._tenant = tenant
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
        self._admission._left(self._tenant)

    def __del__(self) -> None:
        self.release()


class Admission:
    def __init__(self, max_running: int, max_queued: int, tenant_share: float = 1.0) -> None:
        self.max_running = max_running
        self.max_queued = max_queued
        self._slots = asyncio.Semaphore(max_running)
        self.inside = 0  # running + waiting
        self.rejected = 0
        # one tenant's most places (running + waiting): limits.tenant_share of them all
        self.tenant_limit = max(1, math.ceil(tenant_share * (max_running + max_queued)))
        self.by_tenant: dict[str, int] = {}  # tenants with a request inside only

    def _left(self, tenant: str) -> None:
        n = self.by_tenant.get(tenant, 0) - 1
        if n > 0:
            self.by_tenant[tenant] = n
        else:
            self.by_tenant.pop(tenant, None)

    def reserve(self, tenant: str = "") -> Ticket:
        if self.by_tenant.get(tenant, 0) >= self.tenant_limit:
            self.rejected += 1
            raise Overloaded(
                f"this tenant has {self.tenant_limit} requests running or queued here, its share "
                f"(limits.tenant_share of limits.max_concurrent_requests + limits.max_queued_requests); "
                "retry shortly",
                retry_after_s=1,
            )
        if self.inside >= self.max_running + self.max_queued:
            self.rejected += 1
            raise Overloaded(
                f"server busy: {self.max_running} requests running and {self.max_queued} queued "
                f"(limits.max_concurrent_requests / limits.max_queued_requests); retry shortly",
                retry_after_s=1,
            )
        self.inside += 1
        self.by_tenant[tenant] = self.by_tenant.get(tenant, 0) + 1
        return Ticket(self, tenant)
