"""Baselines kept for the diagnosis: each session's previous prompt, and fingerprints by response id.

Both are bounded in number (LRU), in bytes (an estimate of each entry's size: the previous
prompt's text, ids and offsets, the fingerprint's per-token marks) and in time (entries idle
past ``ttl_s`` are dropped).
A session that was dropped is remembered as seen (a keyed digest of its key, bounded
too), so its next request is ``unavailable`` rather than ``first_request``. Fingerprints
by response id are kept per tenant: a lookup names the tenant, and another tenant's id is
simply not found (no sign that it exists).
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from server.cache_diag.fingerprint import Fingerprint, digest

T = TypeVar("T")
Clock = Callable[[], float]


@dataclass(frozen=True)
class Entry(Generic[T]):
    value: T
    at: float  # monotonic time it was stored


def seq_bytes(seq: Sequence[int] | None) -> int:
    """Bytes held by a sequence of ints (an array's items, or a list's pointers and ints)."""
    if seq is None:
        return 0
    return len(seq) * (seq.itemsize if isinstance(seq, array) else 36)


def fingerprint_bytes(fp: Fingerprint) -> int:
    return 256 + seq_bytes(fp.blocks) + seq_bytes(fp.marks) + 96 * (len(fp.messages) + len(fp.tools))


class _Lru(Generic[T]):
    def __init__(
        self,
        capacity: int,
        ttl_s: float | None,
        clock: Clock,
        max_bytes: int | None = None,
        size: Callable[[T], int] | None = None,
    ) -> None:
        self.capacity, self.ttl_s, self.clock = capacity, ttl_s, clock
        self.max_bytes, self.size = max_bytes, size
        self.items: OrderedDict[object, Entry[T]] = OrderedDict()
        self.sizes: dict[object, int] = {}
        self.bytes = 0
        self.dropped: list[object] = []  # keys dropped by the last put/get (for the caller)

    def remove(self, key: object) -> None:
        if key in self.items:
            self._drop(key)

    def _drop(self, key: object) -> None:
        del self.items[key]
        self.bytes -= self.sizes.pop(key, 0)
        self.dropped.append(key)

    def _expire(self, now: float) -> None:
        if self.ttl_s is None:
            return
        while self.items:
            key, entry = next(iter(self.items.items()))
            if now - entry.at < self.ttl_s:
                break
            self._drop(key)

    def get(self, key: object) -> Entry[T] | None:
        self._expire(self.clock())
        return self.items.get(key)

    def put(self, key: object, value: T) -> None:
        now = self.clock()
        self._expire(now)
        if key in self.items:
            del self.items[key]
            self.bytes -= self.sizes.pop(key, 0)
        self.items[key] = Entry(value, now)
        if self.size is not None:  # the key counts too: a session key is client text of any length
            self.sizes[key] = self.size(value) + (len(key) if isinstance(key, str | bytes) else 0)
            self.bytes += self.sizes[key]
        over_bytes = self.max_bytes is not None
        while len(self.items) > self.capacity or (
            over_bytes and self.bytes > (self.max_bytes or 0) and len(self.items) > 0
        ):
            self._drop(next(iter(self.items)))

    def __len__(self) -> int:
        return len(self.items)


class BaselineTable(Generic[T]):
    """Each recent session's baseline, its previous prompt (LRU + TTL), and which sessions were seen."""

    def __init__(
        self,
        capacity: int,
        ttl_s: float | None = 24 * 3600,
        clock: Clock = time.monotonic,
        max_bytes: int | None = None,
        size: Callable[[T], int] | None = None,
        bytes_per_tenant: int | None = None,
    ) -> None:
        self._lru: _Lru[T] = _Lru(capacity, ttl_s, clock, max_bytes, size)
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._seen_capacity = max(16 * capacity, 1024)
        self._lock = threading.Lock()
        # per-tenant quota (bytes; None: none): a tenant over it loses its own oldest sessions first
        self.bytes_per_tenant = bytes_per_tenant
        self._owner: dict[object, tuple[str, int]] = {}  # key -> (tenant, its bytes)
        self._keys_of: dict[str, OrderedDict[object, None]] = {}
        self._used: dict[str, int] = {}

    def _forget_dropped(self) -> None:
        for key in self._lru.dropped:
            self._unown(key)
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

    def put(self, key: str, value: T, tenant: str = "") -> None:
        with self._lock:
            self._lru.put(key, value)
            quota = self.bytes_per_tenant
            if quota is not None and key in self._lru.items:
                self._unown(key)
                size = self._lru.sizes.get(key, 0)
                self._owner[key] = (tenant, size)
                self._keys_of.setdefault(tenant, OrderedDict())[key] = None
                self._used[tenant] = self._used.get(tenant, 0) + size
                order = self._keys_of[tenant]
                while self._used[tenant] > quota and len(order) > 1:
                    self._lru.remove(next(iter(order)))
                    self._forget_dropped()
            self._forget_dropped()

    def _unown(self, key: object) -> None:
        owned = self._owner.pop(key, None)
        if owned is None:
            return
        tenant, size = owned
        self._used[tenant] -= size
        order = self._keys_of[tenant]
        order.pop(key, None)
        if not order:
            del self._keys_of[tenant], self._used[tenant]

    def tenant_bytes(self, tenant: str) -> int:
        return self._used.get(tenant, 0)

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def bytes(self) -> int:
        return self._lru.bytes


class FingerprintStore:
    """Fingerprints by (tenant, response id): at most ``per_tenant`` (and ``bytes_per_tenant``)
    per tenant, for ``ttl_s``."""

    def __init__(
        self,
        per_tenant: int = 1024,
        ttl_s: float = 3600.0,
        clock: Clock = time.monotonic,
        bytes_per_tenant: int | None = None,
    ) -> None:
        self.per_tenant, self.ttl_s, self.clock = per_tenant, ttl_s, clock
        self.bytes_per_tenant = bytes_per_tenant
        self._tenants: dict[str, _Lru[Fingerprint]] = {}
        self._lock = threading.Lock()

    def put(self, tenant: str, response_id: str, fp: Fingerprint) -> None:
        with self._lock:
            lru = self._tenants.get(tenant)
            if lru is None:
                size = fingerprint_bytes if self.bytes_per_tenant is not None else None
                lru = _Lru(self.per_tenant, self.ttl_s, self.clock, self.bytes_per_tenant, size)
                self._tenants[tenant] = lru
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

    def bytes(self, tenant: str) -> int:
        lru = self._tenants.get(tenant)
        return lru.bytes if lru is not None else 0
