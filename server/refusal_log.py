"""Every 4xx the worker answers, with its reason, in one log line (bounded, rate-limited).

The access log says ``"POST /v1/messages HTTP/1.1" 400`` and nothing else: the reason is in the
body the client got. ``FrontDoor`` hands each 4xx here (its own refusals, and the body of every
other 4xx as it is sent, the first ``MAX_BODY`` bytes); one line goes to the log:

    4xx 400 POST /v1/chat/completions error=context_length_exceeded param=messages: This model's …

The status, the route template (never a raw path), the error's code (else its type) and param, and
its message with whitespace folded and cut to ``MAX_MESSAGE`` characters. At most ``BURST`` lines
per ``PERIOD_S`` seconds; past that, lines are counted, and the next line logged says how many were
not.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

MAX_BODY = 8192  # bytes of a 4xx body read for its reason
MAX_MESSAGE = 300  # characters of the error message logged
MAX_FIELD = 64  # characters of code / param logged
BURST = 20  # lines per period
PERIOD_S = 10.0


def _clean(value: Any, limit: int) -> str:
    """One line, control characters out, at most ``limit`` characters (… when cut)."""
    text = " ".join("".join(c if c.isprintable() else " " for c in str(value)).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def reason_of(body: bytes | dict[str, Any]) -> tuple[str | None, str | None, str]:
    """(code, else type; param; message) of an error body: OpenAI's ``{"error": {...}}``, Anthropic's
    ``{"type": "error", "error": {"type", "message"}}``, or any other body as its text."""
    data: Any = body
    if isinstance(body, bytes):
        try:
            data = json.loads(body)
        except ValueError:  # not JSON (or cut at MAX_BODY): its text
            return None, None, body.decode("utf-8", "replace") or "(no body)"
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        detail = data.get("detail") if isinstance(data, dict) else None  # a bare Starlette error
        return None, None, str(detail if detail is not None else data)
    code = error.get("code") or error.get("type")
    param = error.get("param")
    return (
        None if code is None else str(code),
        None if param is None else str(param),
        str(error.get("message", "")),
    )


class RefusalLog:
    """The 4xx lines of one app: rate-limited, thread-safe (the clock is injectable for tests)."""

    def __init__(
        self, burst: int = BURST, period_s: float = PERIOD_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst, self.period_s, self.clock = burst, period_s, clock
        self._lock = threading.Lock()
        self._window_start = -period_s
        self._logged = 0
        self._dropped = 0

    def _admit(self) -> tuple[bool, int]:
        """Whether this line may be logged, and how many were dropped before it."""
        with self._lock:
            now = self.clock()
            if now - self._window_start >= self.period_s:
                self._window_start, self._logged = now, 0
            if self._logged >= self.burst:
                self._dropped += 1
                return False, 0
            self._logged += 1
            dropped, self._dropped = self._dropped, 0
            return True, dropped

    def record(self, status: int, method: str, route: str, body: bytes | dict[str, Any]) -> None:
        ok, dropped = self._admit()
        if not ok:
            return
        code, param, message = reason_of(body)
        fields = "".join(
            f" {name}={_clean(value, MAX_FIELD)}"
            for name, value in (("error", code), ("param", param))
            if value
        )
        more = (
            f" ({dropped} more 4xx not logged: over {self.burst} in {self.period_s:g} s)" if dropped else ""
        )
        log.info(
            "4xx %d %s %s%s: %s%s",
            status,
            _clean(method, 16),
            _clean(route, 128),
            fields,
            _clean(message, MAX_MESSAGE),
            more,
        )
