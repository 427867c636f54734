"""Server-sent events: OpenAI stream framing, with errors as an in-band event."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from server.admission import Ticket
from server.errors import AgentServeError, Timeout, internal_error_body

log = logging.getLogger(__name__)


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


@dataclass(frozen=True)
class Framing:
    """How a dialect's events go on the wire.

    OpenAI Chat Completions: ``data:`` lines, errors as an ``{"error": …}`` event, then
    ``[DONE]``. Responses / Anthropic Messages: ``event: TYPE`` + ``data:`` (the event's
    ``type`` field names it), their own error event (``error_event``), no ``[DONE]``.
    """

    named_events: bool = False
    done: bool = True
    error_event: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def frame(self, data: dict[str, Any] | str) -> str:
        if self.named_events and isinstance(data, dict) and isinstance(data.get("type"), str):
            payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
            return f"event: {data['type']}\ndata: {payload}\n\n"
        return sse(data)

    def error(self, body: dict[str, Any]) -> str:
        return self.frame(self.error_event(body) if self.error_event is not None else body)


OPENAI_FRAMING = Framing()


async def sse_stream(
    chunks: AsyncIterator[dict[str, Any]],
    ticket: Ticket | None = None,
    timeout_s: float | None = None,
    framing: Framing | None = None,
) -> AsyncGenerator[str, None]:
    """Frame chunks as SSE; an error after the stream began becomes an error event, then [DONE].

    A client disconnect cancels this generator at its current await; closing ``chunks``
    then cancels the engine request. The admission ticket is released in every case.
    """
    framing = framing or OPENAI_FRAMING
    deadline = time.monotonic() + timeout_s if timeout_s else None
    try:
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                chunk = await asyncio.wait_for(anext(chunks), wait)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise Timeout(f"request timed out after {timeout_s:g} s (limits.request_timeout_s)") from None
            yield framing.frame(chunk)
    except AgentServeError as exc:
        yield framing.error(exc.body())
    except Exception as exc:  # the status line is gone: report in-band, never drop silently
        log.exception("stream failed")
        yield framing.error(internal_error_body(exc))
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
        if ticket is not None:
            ticket.release()
    if framing.done:
        yield sse("[DONE]")
