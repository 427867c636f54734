"""Request bodies bounded however they are framed: bytes are counted as they arrive.

A ``Content-Length`` over the limit is refused by the front door before anything is read;
a chunked body (no length) is read here, counting, and refused with the same 413 the moment
it passes ``limits.max_request_bytes``, before any route parses or tokenizes it. A body within
the limit is handed to the app unchanged (replayed from the buffer; the route reads it whole
anyway), later ``receive`` calls (a client disconnect) go to the server. A body that takes
longer than ``limits.body_timeout_s`` to arrive (a slow sender holding a connection) is a 408.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.dialects.messages.error_shape import shape_error
from server.errors import AgentServeError, PayloadTooLarge


class BodyTimeout(AgentServeError):
    status = 408
    type = "invalid_request_error"
    default_code = "request_timeout"


def too_slow(timeout_s: float) -> BodyTimeout:
    return BodyTimeout(
        f"the request body did not arrive within {timeout_s:g} s (limits.body_timeout_s): send it at once"
    )


def too_large(limit: int, length: str | None = None) -> PayloadTooLarge:
    size = f"{length} bytes" if length is not None else f"over {limit} bytes"
    return PayloadTooLarge(
        f"request body is {size}; the limit is {limit} (limits.max_request_bytes): "
        f"send a shorter conversation"
    )


class BodyLimit:
    """ASGI middleware: a 413 once a request body passes ``max_bytes``, however it is framed."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 60.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                parts = await read_body(receive, self.max_bytes)
        except AgentServeError as exc:
            await _send_error(send, exc, scope["path"])
            return
        except TimeoutError:
            await _send_error(send, too_slow(self.timeout_s), scope["path"])
            return
        if parts is None:
            return  # the client left before its body was complete: nothing to answer
        body: Message | None = {"type": "http.request", "body": b"".join(parts), "more_body": False}

        async def replay() -> Message:
            nonlocal body
            if body is not None:
                first, body = body, None
                return first
            return await receive()

        await self.app(scope, replay, send)


async def read_body(receive: Receive, max_bytes: int) -> list[bytes] | None:
    """The body's chunks, counted as they arrive (PayloadTooLarge past ``max_bytes``); None when
    the client disconnected first."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
        parts.append(chunk)
        if not message.get("more_body", False):
            return parts


async def _send_error(send: Send, exc: AgentServeError, path: str) -> None:
    payload: Any = json.dumps(shape_error(path, exc.status, exc.body())).encode()
    await send(
        {
            "type": "http.response.start",
            "status": exc.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
