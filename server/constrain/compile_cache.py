"""Compiled grammars, cached (LRU by entries) and compiled under a time limit.

A grammar compile is native code that cannot be interrupted; a hostile schema or Lark grammar
could hold a request for minutes. ``get_or_make`` runs each compile on a small shared pool
and waits at most ``compile_timeout_s()`` seconds: past that the request gets a
``ConstraintError`` (a 400 naming ``limits.grammar_compile_timeout_s``) and the compile
finishes in the background into the cache, so a retry of the same schema is served from it.
The same key is never compiled twice at once: a second request waits on the first's compile.
At most ``_WORKERS`` compiles run at a time; more wait their turn (and may time out waiting).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from server.constrain.errors import ConstraintError

_WORKERS = 2
_PREFIX = "grammar-compile"
_POOL = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix=_PREFIX)
_TIMEOUT_S: list[float | None] = [30.0]  # set once at start from limits.grammar_compile_timeout_s


def set_compile_timeout(seconds: float | None) -> None:
    """The most a request waits for one grammar compile (None: no limit)."""
    _TIMEOUT_S[0] = seconds


def compile_timeout_s() -> float | None:
    return _TIMEOUT_S[0]


class CompileCache:
    """A thread-safe LRU of compiled grammars, each compiled once, under the time limit."""

    def __init__(self, limit: int) -> None:
        self.limit, self.lock = limit, threading.Lock()
        self.data: OrderedDict[Any, Any] = OrderedDict()
        self.pending: dict[Any, Future[Any]] = {}

    def get_or_make(self, key: Any, make: Callable[[], Any], what: str = "the grammar") -> Any:
        if threading.current_thread().name.startswith(_PREFIX):
            # a compile compiling a part: never wait on the pool from inside it (a full pool deadlocks)
            with self.lock:
                if key in self.data:
                    return self.data[key]
            value = make()
            with self.lock:
                self._put(key, value)
            return value
        with self.lock:
            if key in self.data:
                self.data.move_to_end(key)
                return self.data[key]
            future = self.pending.get(key)
            if future is None:
                future = _POOL.submit(make)
                self.pending[key] = future
                future.add_done_callback(lambda f: self._store(key, f))
        timeout = compile_timeout_s()
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            raise ConstraintError(
                f"compiling {what} took longer than {timeout:g} s "
                "(limits.grammar_compile_timeout_s): simplify the schema or grammar",
                param="tools",
            ) from None

    def _store(self, key: Any, future: Future[Any]) -> None:
        with self.lock:
            self.pending.pop(key, None)
            if future.cancelled() or future.exception() is not None:
                return  # an error is raised to every waiter; nothing is cached
            self._put(key, future.result())

    def _put(self, key: Any, value: Any) -> None:
        self.data[key] = value
        self.data.move_to_end(key)
        while len(self.data) > self.limit:
            self.data.popitem(last=False)

    def __len__(self) -> int:
        return len(self.data)
