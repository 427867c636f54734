"""Packed mask rows and compiled grammars, cached for the whole process under one byte budget.

Every trie (per tool list) and every envelope's mask set caches the packed int32 rows it
builds (one per node × allowed subset). A row is ``vocab / 8`` bytes (19 KB for a 152k
vocabulary), so a count bound alone lets a few hundred tool lists hold gigabytes. Compiled
grammars (``compile_cache.py``) are stored here too, each charged its own size (an xgrammar
grammar of a pattern-heavy schema can be hundreds of MB). All of them share this LRU, bounded
in bytes (``limits.mask_cache_mb``, default 256 MiB): the least recently used entry goes
first, whoever cached it. A row that is dropped is simply rebuilt on its next use (a few µs
to a ms); a grammar is compiled again. An entry larger than the whole budget is not kept.

Owners key their entries with a token from ``owner_token()`` (never reused, unlike ``id()``).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

_TOKENS = itertools.count(1)


def owner_token() -> int:
    return next(_TOKENS)


class RowCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_make(self, key: Hashable, make: Callable[[], np.ndarray]) -> np.ndarray:
        row = self.get(key)
        if row is not None:
            return row  # type: ignore[no-any-return]
        row = make()  # outside the lock; a duplicate build is harmless
        self.put(key, row, row.nbytes, keep_one=True)
        return row

    def get(self, key: Hashable) -> Any | None:
        """The value cached under ``key`` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: Any, nbytes: int, keep_one: bool = False) -> bool:
        """Cache ``value`` charged ``nbytes``; False (not kept) when it alone is over the budget,
        unless ``keep_one`` (a mask row: the newest row is always kept)."""
        with self._lock:
            self._drop(key)
            if nbytes > self.max_bytes and not keep_one:
                return False
            self._entries[key] = (value, nbytes)
            self.bytes += nbytes
            while self.bytes > self.max_bytes and len(self._entries) > 1:
                self._drop(next(iter(self._entries)))
            return key in self._entries

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def discard(self, key: Hashable) -> None:
        with self._lock:
            self._drop(key)

    def _drop(self, key: Hashable) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]

    def set_budget(self, max_bytes: int) -> None:
        with self._lock:
            self.max_bytes = max_bytes
            while self.bytes > self.max_bytes and self._entries:
                self._drop(next(iter(self._entries)))

    def __len__(self) -> int:
        return len(self._entries)


ROWS = RowCache(256 * 2**20)  # the process's one cache; set_budget from limits.mask_cache_mb at start
