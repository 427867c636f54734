"""Packed mask rows, cached for the whole process under one byte budget.

Every trie (per tool list) and every envelope's mask set caches the packed int32 rows it
builds (one per node × allowed subset). A row is ``vocab / 8`` bytes (19 KB for a 152k
vocabulary), so a count bound alone lets a few hundred tool lists hold gigabytes. All of
them share this LRU, bounded in bytes (``limits.mask_cache_mb``, default 256 MiB): the
least recently used row goes first, whoever cached it. A row that is dropped is simply
rebuilt on its next use (a few µs to a ms).

Owners key their rows with a token from ``owner_token()`` (never reused, unlike ``id()``).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np

_TOKENS = itertools.count(1)


def owner_token() -> int:
    return next(_TOKENS)


class RowCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._rows: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_make(self, key: Hashable, make: Callable[[], np.ndarray]) -> np.ndarray:
        with self._lock:
            row = self._rows.get(key)
            if row is not None:
                self._rows.move_to_end(key)
                return row
        row = make()  # outside the lock; a duplicate build is harmless
        with self._lock:
            old = self._rows.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            self._rows[key] = row
            self.bytes += row.nbytes
            while self.bytes > self.max_bytes and len(self._rows) > 1:
                _, dropped = self._rows.popitem(last=False)
                self.bytes -= dropped.nbytes
        return row

    def set_budget(self, max_bytes: int) -> None:
        with self._lock:
            self.max_bytes = max_bytes
            while self.bytes > self.max_bytes and self._rows:
                _, dropped = self._rows.popitem(last=False)
                self.bytes -= dropped.nbytes

    def __len__(self) -> int:
        return len(self._rows)


ROWS = RowCache(256 * 2**20)  # the process's one cache; set_budget from limits.mask_cache_mb at start
