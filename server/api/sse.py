"""Server-sent events: OpenAI stream framing, with errors as an in-band event."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from server.errors import AgentServeError, internal_error_body

log = logging.getLogger(__name__)


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


async def sse_stream(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """Frame chunks as SSE; an error after the stream began becomes an error event, then [DONE]."""
    try:
        async for chunk in chunks:
            yield sse(chunk)
    except AgentServeError as exc:
        yield sse(exc.body())
    except Exception as exc:  # the status line is gone: report in-band, never drop silently
        log.exception("stream failed")
        yield sse(internal_error_body(exc))
    yield sse("[DONE]")
