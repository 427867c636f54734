"""Log lines derived from a request, bounded: a global rate, long values cut.

A request decides what some log lines say (a dropped hosted tool's type, an unknown field's name)
and how many there are. Unbounded, one request with 100,000 hosted tools wrote 100,000 lines and
stalled the event loop for a second; a flood of requests is a flood of lines. Such lines go
through ``REQUEST_LOG``: at most ``burst`` at once and ``per_second`` after that, process-wide
(the rest are counted and the next line written says how many were suppressed); every value a
client chose is cut to ``cut``'s limit first. A request logs at most one summary line per thing
it did ("dropped 100 hosted tools: web_search x99, ...").
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable

MAX_VALUE_CHARS = 64


def cut(value: object, limit: int = MAX_VALUE_CHARS) -> str:
    """``value`` as text, at most ``limit`` characters (then how long it was)."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def tally(values: Iterable[object], most: int = 8) -> str:
    """``a x3, b x1`` for the first ``most`` distinct values (each cut), then how many more kinds."""
    counts: dict[str, int] = {}
    extra = 0
    for value in values:
        key = cut(value)
        if key in counts:
            counts[key] += 1
        elif len(counts) < most:
            counts[key] = 1
        else:
            extra += 1
    text = ", ".join(f"{k} x{n}" for k, n in counts.items())
    return text + (f", and {extra} more" if extra else "")


_SUFFIX = re.compile(r" \(\d+ request log lines suppressed before this one: at most [^ ]+/s\)$")


class LogBudget:
    """A token bucket for request-derived log lines (thread-safe: requests are prepared in threads)."""

    def __init__(
        self, per_second: float = 10.0, burst: int = 50, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_second, self.burst, self.clock = per_second, burst, clock
        self.tokens = float(burst)
        self.last = clock()
        self.suppressed = 0
        self.lock = threading.Lock()

    def suffix(self, held: int) -> str:
        """What a line that follows suppressed ones carries (bounded: a count and the rate)."""
        return f" ({held} request log lines suppressed before this one: at most {self.per_second:g}/s)"

    @staticmethod
    def unsuffixed(line: str) -> str:
        """A written line without the suppressed count (tests measure the request's own part)."""
        return _SUFFIX.sub("", line)

    def log(self, logger: logging.Logger, level: int, msg: str, *args: object) -> bool:
        """Write the line if the budget allows (True), else count it as suppressed."""
        if not logger.isEnabledFor(level):
            return False
        with self.lock:
            now = self.clock()
            self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.per_second)
            self.last = now
            if self.tokens < 1.0:
                self.suppressed += 1
                return False
            self.tokens -= 1.0
            held, self.suppressed = self.suppressed, 0
        if held:
            msg += self.suffix(held)
        logger.log(level, msg, *args)
        return True


REQUEST_LOG = LogBudget()
