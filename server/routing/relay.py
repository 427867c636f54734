"""The router's relays of a worker's answer to the client, each holding a bounded window.

``EventRelay`` (SSE) forwards events as they come, holding back only an incomplete trailing event
(at most ``RELAY_WINDOW`` bytes of it); ``BodyRelay`` (a JSON answer over ``RELAY_WINDOW``)
forwards bytes as they come. The upstream client buffers at most its own window before it stops
reading the worker (``raw_http.HIGH_WATER``), so a client slower than its worker makes the worker
wait, not the router hold the answer.
"""

from __future__ import annotations

import json
from typing import Protocol

from starlette.types import Send

from server.dialects.messages.error_shape import from_openai
from server.errors import AgentServeError


class Relay(Protocol):
    async def push(self, chunk: bytes) -> None: ...

    async def finish(self) -> None: ...

    async def fail(self, err: AgentServeError) -> None: ...


def content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    value = next((v for k, v in headers if k == b"content-length"), None)
    return int(value) if value is not None and value.strip().isdigit() else None


class BodyRelay:
    """A large JSON answer, forwarded as it comes; a failure mid-body leaves it short of its
    ``Content-Length`` (the server closes the connection: the client sees it cut)."""

    def __init__(self, send: Send) -> None:
        self.send = send

    async def push(self, chunk: bytes) -> None:
        if chunk:
            await self.send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def finish(self) -> None:
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def fail(self, err: AgentServeError) -> None:
        return None


RELAY_WINDOW = 256 * 1024  # bytes of an answer the router holds per request, beyond the upstream's buffer


class EventRelay:
    """Forwards SSE bytes as they come, holding back only an incomplete trailing event, so
    that an error event can always be appended on a clean event boundary.

    Linear in the bytes: each chunk is searched once for the last event boundary (with the 3
    bytes before it, for a boundary split across chunks); the held event is kept as a list of
    pieces, joined once when it is sent. At most ``window`` bytes are held: an event larger than
    that goes out in pieces as it comes (a failure inside it then ends the stream after a blank
    line, on a broken event, rather than the router holding a whole giant event per request).
    """

    def __init__(self, send: Send, messages: bool = False, window: int = RELAY_WINDOW) -> None:
        self.send, self.messages = send, messages  # messages: Anthropic's error event, no [DONE]
        self.window = window
        self.held: list[bytes] = []
        self.held_bytes = 0
        self.tail = b""  # the last bytes held (a boundary may begin in them)
        self.torn = False  # part of the current event was sent without its end

    async def push(self, chunk: bytes) -> None:
        probe = self.tail + chunk
        end = max(_after(probe, b"\n\n"), _after(probe, b"\r\n\r\n"))
        if end:  # events complete: send them with what was held
            cut = end - len(self.tail)
            await self._flush(chunk[:cut])
            self.torn = False
            chunk = chunk[cut:]
            probe = chunk
        if chunk:  # an incomplete event: hold it, or pass it on past the window
            self.held.append(chunk)
            self.held_bytes += len(chunk)
            self.tail = probe[-3:]
            if self.held_bytes > self.window:
                await self._flush(b"")
                self.torn, self.tail = True, probe[-3:]

    async def _flush(self, last: bytes) -> None:
        body = b"".join([*self.held, last]) if self.held else last
        self.held, self.held_bytes, self.tail = [], 0, b""
        if body:
            await self.send({"type": "http.response.body", "body": body, "more_body": True})

    async def finish(self) -> None:
        body = b"".join(self.held)
        self.held, self.held_bytes = [], 0
        await self.send({"type": "http.response.body", "body": body, "more_body": False})

    async def fail(self, err: AgentServeError) -> None:
        if self.messages:
            data = json.dumps(from_openai(err.body()))
            event = b"event: error\ndata: " + data.encode() + b"\n\n"
        else:
            event = b"data: " + json.dumps(err.body()).encode() + b"\n\ndata: [DONE]\n\n"
        if self.torn:  # end the broken event first (the held part of it is dropped)
            event = b"\n\n" + event
        await self.send({"type": "http.response.body", "body": event, "more_body": False})


def _after(data: bytes, boundary: bytes) -> int:
    """The offset just past the last ``boundary`` in ``data``, 0 when there is none."""
    at = data.rfind(boundary)
    return at + len(boundary) if at >= 0 else 0
