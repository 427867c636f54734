"""Requests that workers died on: never replayed blindly to the rest of the fleet.

A connection that drops after the request was sent, before any answer, may mean the request
itself killed the worker (a crash in the engine on this input). The router then replays it to
another worker at most ``routing.max_lost_replays`` times, and remembers its digest: once
``routing.max_worker_losses`` workers have died on the same body, it is refused at once
(a 503 naming the setting) instead of taking down more workers. The table is bounded (LRU).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

MAX_REMEMBERED = 4096


def body_digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


class SuspectTable:
    """How many workers each recent request body was lost on (bounded LRU of digests)."""

    def __init__(self, capacity: int = MAX_REMEMBERED) -> None:
        self.capacity = capacity
        self._losses: OrderedDict[bytes, int] = OrderedDict()

    def losses(self, body: bytes) -> int:
        if not self._losses:
            return 0  # the hot path: nothing suspect, no hashing
        return self._losses.get(body_digest(body), 0)

    def lost(self, body: bytes) -> int:
        """Count one more worker lost on ``body``; the new count."""
        key = body_digest(body)
        count = self._losses.pop(key, 0) + 1
        self._losses[key] = count
        while len(self._losses) > self.capacity:
            self._losses.popitem(last=False)
        return count
