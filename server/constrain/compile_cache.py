"""Compiled grammars, cached by bytes (in the mask rows' budget) and compiled under a time limit.

A grammar compile is native code that cannot be interrupted; a hostile schema or Lark grammar
could hold a request for minutes. ``get_or_make`` runs each compile on a small shared pool
and waits at most ``compile_timeout_s()`` seconds: past that the request gets a
``ConstraintError`` (a 400 naming ``limits.grammar_compile_timeout_s``). A compile still
waiting for a pool thread then is cancelled (it never runs); one already running cannot be
stopped (xgrammar, llguidance and outlines-core have no cancel), so it finishes in the
background into the cache, where a retry of the same schema finds it. While it runs, every
request for the same key gets the 400 at once instead of waiting again. The same key is never
compiled twice at once: a second request waits on the first's compile. At most ``_WORKERS``
compiles run at a time; more wait their turn (and may time out waiting).

Finished grammars live in the process's one byte-bounded LRU (``row_cache.ROWS``,
``limits.mask_cache_mb``) together with the mask rows, each charged ``size(value)`` bytes;
a grammar larger than the whole budget serves its request but is not kept. ``limit`` also
bounds each cache's entries.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from server.constrain.errors import ConstraintError
from server.constrain.row_cache import ROWS, RowCache, owner_token

_WORKERS = 2
_PREFIX = "grammar-compile"
POOL = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix=_PREFIX)


def new_pool() -> ThreadPoolExecutor:
    """A compile pool like ``POOL`` (a test swaps it in to start from idle threads)."""
    return ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix=_PREFIX)


_TIMEOUT_S: list[float | None] = [30.0]  # set once at start from limits.grammar_compile_timeout_s
DEFAULT_SIZE = 64 * 1024  # bytes charged for a value whose size is unknown


def set_compile_timeout(seconds: float | None) -> None:
    """The most a request waits for one grammar compile (None: no limit)."""
    _TIMEOUT_S[0] = seconds


def compile_timeout_s() -> float | None:
    return _TIMEOUT_S[0]


class CompileCache:
    """A thread-safe LRU of compiled grammars, each compiled once, under the time limit."""

    def __init__(
        self, limit: int, size: Callable[[Any], int] | None = None, store: RowCache | None = None
    ) -> None:
        # reentrant: a compile already done when its callback is added runs _store at once, under the lock
        self.limit, self.lock = limit, threading.RLock()
        self.size = size or (lambda _: DEFAULT_SIZE)
        self.store = store if store is not None else ROWS
        self.token = owner_token()
        self.keys: OrderedDict[Any, None] = OrderedDict()  # this cache's keys, oldest first
        self.pending: dict[Any, Future[Any]] = {}
        self.overdue: set[Any] = set()  # keys whose running compile passed the time limit

    def _cached(self, key: Any) -> Any | None:
        value = self.store.get((self.token, key))
        if value is None:
            self.keys.pop(key, None)  # evicted from the shared budget (or never there)
        else:
            self.keys.move_to_end(key)
        return value

    def get_or_make(self, key: Any, make: Callable[[], Any], what: str = "the grammar") -> Any:
        if threading.current_thread().name.startswith(_PREFIX):
            # a compile compiling a part: never wait on the pool from inside it (a full pool deadlocks)
            with self.lock:
                found = self._cached(key)
            if found is not None:
                return found
            value = make()
            with self.lock:
                self._put(key, value)
            return value
        timeout = compile_timeout_s()
        with self.lock:
            found = self._cached(key)
            if found is not None:
                return found
            if key in self.overdue and key in self.pending:
                raise self._too_slow(what, timeout)
            future = self.pending.get(key)
            if future is None:
                future = POOL.submit(make)
                self.pending[key] = future
                future.add_done_callback(lambda f: self._store(key, f))
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            if not future.cancel():  # (outside the lock: cancel runs the done callback, _store, at once)
                with self.lock:  # running: it cannot be stopped; later requests for it fail fast
                    if self.pending.get(key) is future:
                        self.overdue.add(key)
            raise self._too_slow(what, timeout) from None

    @staticmethod
    def _too_slow(what: str, timeout: float | None) -> ConstraintError:
        return ConstraintError(
            f"compiling {what} took longer than {timeout or 0:g} s "
            "(limits.grammar_compile_timeout_s): simplify the schema or grammar",
            param="tools",
        )

    def _store(self, key: Any, future: Future[Any]) -> None:
        with self.lock:
            self.pending.pop(key, None)
            self.overdue.discard(key)
            if future.cancelled() or future.exception() is not None:
                return  # an error is raised to every waiter; nothing is cached
            self._put(key, future.result())

    def _put(self, key: Any, value: Any) -> None:
        try:
            nbytes = int(self.size(value))
        except Exception:  # a size probe must never fail a compile
            nbytes = DEFAULT_SIZE
        if not self.store.put((self.token, key), value, nbytes):
            return  # larger than the whole budget: it served its request, it is not kept
        self.keys[key] = None
        self.keys.move_to_end(key)
        while len(self.keys) > self.limit:
            old, _ = self.keys.popitem(last=False)
            self.store.discard((self.token, old))

    def __len__(self) -> int:
        with self.lock:
            return sum(1 for k in list(self.keys) if (self.token, k) in self.store)
