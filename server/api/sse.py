"""Server-sent events: OpenAI stream framing, with errors as an in-band event."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from server.admission import Ticket
from server.errors import AgentServeError, Timeout, internal_error_body

log = logging.getLogger(__name__)


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


async def sse_stream(
    chunks: AsyncIterator[dict[str, Any]], ticket: Ticket | None = None, timeout_s: float | None = None
) -> AsyncIterator[str]:
    """Frame chunks as SSE; an error after the stream began becomes an error event, then [DONE].

    A client disconnect cancels this generator at its current await; closing ``chunks``
    then cancels the engine request. The admission ticket is released in every case.
    """
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
            yield sse(chunk)
    except AgentServeError as exc:
        yield sse(exc.body())
    except Exception as exc:  # the status line is gone: report in-band, never drop silently
        log.exception("stream failed")
        yield sse(internal_error_body(exc))
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
        if ticket is not None:
            ticket.release()
    yield sse("[DONE]")
