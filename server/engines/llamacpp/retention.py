"""The llamacpp engine's session policy: which idle slot the pool gives up first.

``prefix_cache.policy: session`` (the default) ranks idle slots as the hf engine ranks sessions
(``server/kvcache/retention.py``, whose ``SessionBook`` this keeps): first the slots no live session
needs (a request without a session key, a session ended or idle past its expiry, an older branch
of a session that runs again now), then by the session's *hit density*: the chance it is back
before the pool's turnover time (the longest any live idle session has waited) per second of
memory held, from the pauses learned per tool ("person" after a text reply); equal densities: the
latest expected back first, then the least recently used. A session whose next request has arrived
(the chat service says so before the request waits for the engine) is kept first, and so is one
inside its client's retention hint (``cache_control`` ttl, ``prompt_cache_retention``).
``lru``: least recently used first. With tier 2 on, the slot given up is saved there first.

Events: the chat service's ``request_arrived`` / ``reply_finished`` (any thread), the scheduler's
admission (``began``) and end of a request (``released``) on the engine thread: one lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from server.engines.llamacpp.slots import Slot, least_recently_used
from server.kvcache.sessions import CacheCounters, SessionBook

SESSIONS = 4096  # sessions remembered (least recently active forgotten first)


class SlotRetention:
    def __init__(self, policy: str, cap_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self.book = SessionBook(SESSIONS, cap_s, 1, CacheCounters())
        self._lock = threading.Lock()

    # -- events -----------------------------------------------------------------------------------
    def began(self, session: str, retain_s: float) -> None:
        """A request of the session was admitted: the session runs (its pause, if any, is learned)."""
        if session:
            with self._lock:
                self.book.begin(session, (), lambda ids: [], self.clock(), retain_s)

    def arrived(self, session: str) -> None:
        if session:
            with self._lock:
                self.book.arrived(session, self.clock())

    def finished(self, session: str, tool_names: Sequence[str] = (), *, if_running: bool = False) -> None:
        """The session's reply ended on ``tool_names`` (none: text). ``if_running``: the engine's
        default at the end of a request, which must not overwrite the chat service's word."""
        if session:
            with self._lock:
                self.book.reply_finished(session, tool_names, self.clock(), if_running=if_running)

    # -- the choice -------------------------------------------------------------------------------
    def victim(self, idle: list[Slot]) -> Slot:
        """The idle slot to give up (``idle`` is not empty)."""
        if self.policy != "session":
            return least_recently_used(idle)
        now = self.clock()
        with self._lock:
            records = self.book.sessions
            live = {}
            for s in idle:
                r = records.get(s.session) if s.session else None
                if r is not None and r.state != "running" and not records.expired(r, now):
                    live[s.seq] = r
            horizon = max((now - r.since for r in live.values()), default=0.0)

            def rank(s: Slot) -> tuple[float, float, int]:
                r = live.get(s.seq)
                if r is None:  # nobody needs it: first
                    return (float("-inf"), 0.0, s.used)
                return (records.keep_value(r, now, horizon), -records.time_to_return(r, now), s.used)

            return min(idle, key=rank)
