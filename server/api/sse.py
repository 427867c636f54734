"""Server-sent events: OpenAI stream framing, with errors as an in-band event."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Send

from server.admission import Ticket
from server.errors import AgentServeError, Timeout, internal_error_body
from server.log_budget import REQUEST_LOG
from server.send_deadline import SendTimeout

log = logging.getLogger(__name__)


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


@dataclass(frozen=True)
class Framing:
    """How a dialect's events go on the wire.

    OpenAI Chat Completions: ``data:`` lines, errors as an ``{"error": …}`` event, then
    ``[DONE]``. Responses / Anthropic Messages: ``event: TYPE`` + ``data:`` (the event's
    ``type`` field names it), their own error event (``error_event``), no ``[DONE]``. A stream
    silent for ``limits.stream_keepalive_s`` sends ``keepalive_event`` (Anthropic's ``ping``)
    or, without one, an SSE comment line (clients ignore it; proxies and idle watchdogs see bytes).
    """

    named_events: bool = False
    done: bool = True
    error_event: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    keepalive_event: dict[str, Any] | None = None

    def frame(self, data: dict[str, Any] | str) -> str:
        if self.named_events and isinstance(data, dict) and isinstance(data.get("type"), str):
            payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
            return f"event: {data['type']}\ndata: {payload}\n\n"
        return sse(data)

    def error(self, body: dict[str, Any]) -> str:
        return self.frame(self.error_event(body) if self.error_event is not None else body)

    def keepalive(self) -> str:
        return self.frame(self.keepalive_event) if self.keepalive_event is not None else KEEPALIVE_COMMENT


OPENAI_FRAMING = Framing()
KEEPALIVE_COMMENT = ": keep-alive\n\n"


async def sse_stream(
    chunks: AsyncIterator[dict[str, Any]],
    ticket: Ticket | None = None,
    timeout_s: float | None = None,
    framing: Framing | None = None,
    keepalive_s: float | None = None,
) -> AsyncGenerator[str, None]:
    """Frame chunks as SSE; an error after the stream began becomes an error event, then [DONE].

    A client disconnect cancels this generator at its current await; closing ``chunks``
    then cancels the engine request. The admission ticket is released in every case. With
    ``keepalive_s``, a wait that long for the next chunk (prefill, hidden reasoning) yields
    ``framing.keepalive()`` and keeps waiting (the pending chunk is never cancelled for it).
    """
    framing = framing or OPENAI_FRAMING
    deadline = time.monotonic() + timeout_s if timeout_s else None
    pending: asyncio.Future[dict[str, Any]] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(chunks))
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if keepalive_s:
                wait = keepalive_s if wait is None else min(wait, keepalive_s)
            done, _ = await asyncio.wait({pending}, timeout=wait)
            if not done:
                if deadline is not None and time.monotonic() >= deadline:
                    raise Timeout(f"request timed out after {timeout_s:g} s (limits.request_timeout_s)")
                yield framing.keepalive()
                continue
            task, pending = pending, None
            try:
                chunk = task.result()
            except StopAsyncIteration:
                break
            yield framing.frame(chunk)
    except AgentServeError as exc:
        yield framing.error(exc.body())
    except Exception as exc:  # the status line is gone: report in-band, never drop silently
        log.exception("stream failed")
        yield framing.error(internal_error_body(exc))
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await chunks.aclose()  # type: ignore[attr-defined]
        if ticket is not None:
            ticket.release()
    if framing.done:
        yield sse("[DONE]")


class EventStreamResponse(StreamingResponse):
    """A ``StreamingResponse`` that ends cleanly when a write passes its deadline.

    A client that stops reading fills the socket buffers, and then a write waits forever, with
    the body generator (its admission ticket, its engine request) suspended at its ``yield``:
    the stream deadline is only checked between chunks. The front door's sender
    (``server/send_deadline.py``) bounds every write by ``limits.stream_send_timeout_s``; past it
    the body generator is closed here (``sse_stream``'s ``finally``: the engine request cancelled,
    the ticket released) and the response ended unfinished; uvicorn then closes the connection.
    """

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        except SendTimeout as exc:
            REQUEST_LOG.log(log, logging.WARNING, "%s: the stream ends and frees its slot", exc)
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
