"""Baselines kept for the diagnosis: each session's previous prompt, and fingerprints by response id.

Both are bounded in number (LRU) and in time (entries idle past ``ttl_s`` are dropped).
A session that was dropped is remembered as seen (a keyed digest of its key, bounded
too), so its next request is ``unavailable`` rather than ``first_request``. Fingerprints
by response id are kept per tenant: a lookup names the tenant, and another tenant's id is
simply not found (no sign that it exists).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from server.cache_diag.fingerprint import Fingerprint, digest

T = TypeVar("T")
Clock = Callable[[], float]


@dataclass(frozen=True)
class Entry(Generic[T]):
    value: T
    at: float  # monotonic time it was stored


class _Lru(Generic[T]):
    def __init__(self, capacity: int, ttl_s: float | None, clock: Clock) -> None:
        self.capacity, self.ttl_s, self.clock = capacity, ttl_s, clock
        self.items: OrderedDict[object, Entry[T]] = OrderedDict()
        self.dropped: list[object] = []  # keys dropped by the last put/get (for the caller)

    def _expire(self, now: float) -> None:
        if self.ttl_s is None:
            return
        while self.items:
            key, entry = next(iter(self.items.items()))
            if now - entry.at < self.ttl_s:
                break
            del self.items[key]
            self.dropped.append(key)

    def get(self, key: object) -> Entry[T] | None:
        self._expire(self.clock())
        return self.items.get(key)

    def put(self, key: object, value: T) -> None:
        now = self.clock()
        self._expire(now)
        self.items.pop(key, None)
        self.items[key] = Entry(value, now)
        while len(self.items) > self.capacity:
            old, _ = self.items.popitem(last=False)
            self.dropped.append(old)

    def __len__(self) -> int:
        return len(self.items)


class SessionTable(Generic[T]):
    """The previous prompt of each recent session (LRU + TTL), and which sessions were seen."""

    def __init__(self, capacity: int, ttl_s: float | None = 24 * 3600, clock: Clock = time.monotonic) -> None:
        self._lru: _Lru[T] = _Lru(capacity, ttl_s, clock)
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._seen_capacity = max(16 * capacity, 1024)
        self._lock = threading.Lock()

    def _forget_dropped(self) -> None:
        for key in self._lru.dropped:
            self._seen[digest(str(key))] = None
            self._seen.move_to_end(digest(str(key)))
        self._lru.dropped.clear()
        while len(self._seen) > self._seen_capacity:
            self._seen.popitem(last=False)

    def lookup(self, key: str) -> tuple[Entry[T] | None, bool]:
        """(the session's entry, or None; whether the session was seen before)."""
        with self._lock:
            entry = self._lru.get(key)
            self._forget_dropped()
            return entry, entry is not None or digest(key) in self._seen

    def get(self, key: str) -> T | None:
        entry, _ = self.lookup(key)
        return entry.value if entry else None

    def put(self, key: str, value: T) -> None:
        with self._lock:
            self._lru.put(key, value)
            self._forget_dropped()

    def __len__(self) -> int:
        return len(self._lru)


class FingerprintStore:
    """Fingerprints by (tenant, response id): at most ``per_tenant`` per tenant, for ``ttl_s``."""

    def __init__(self, per_tenant: int = 1024, ttl_s: float = 3600.0, clock: Clock = time.monotonic) -> None:
        self.per_tenant, self.ttl_s, self.clock = per_tenant, ttl_s, clock
        self._tenants: dict[str, _Lru[Fingerprint]] = {}
        self._lock = threading.Lock()

    def put(self, tenant: str, response_id: str, fp: Fingerprint) -> None:
        with self._lock:
            lru = self._tenants.setdefault(tenant, _Lru(self.per_tenant, self.ttl_s, self.clock))
            lru.put(response_id, fp)
            lru.dropped.clear()

    def get(self, tenant: str, response_id: str) -> Entry[Fingerprint] | None:
        with self._lock:
            lru = self._tenants.get(tenant)
            if lru is None:
                return None
            entry = lru.get(response_id)
            lru.dropped.clear()
            return entry

    def __len__(self) -> int:
        return sum(len(v) for v in self._tenants.values())
