"""Every response body goes out through one sender with a deadline (worker and router alike).

A client that stops reading fills the socket buffers; then a write waits for it forever, and
everything behind the write waits too: a non-streamed answer (a stored response of megabytes)
stays whole in memory, a stream keeps its engine request and admission slot. ``deadline_send``
wraps an ASGI ``send``: each message the app sends (a whole JSON body, one stream event) must be
taken by the client within ``limits.stream_send_timeout_s``, else ``SendTimeout`` is raised out
of the app's ``send`` and the response is abandoned (the front door or the router's relay catches
it; the connection is then closed by the server).

A large body goes to the server in slices of ``SLICE_BYTES``: asyncio's transport takes every
byte it is given into its buffer before it waits, so one 7 MiB ``send`` would sit in that buffer
whole until the client reads it or TCP gives up. In slices, a client that stops reading holds at
most one slice (plus the transport's high-water mark and the kernel's buffers) once its response
is abandoned; the rest of the body is freed with the response.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from starlette.types import Message, Send

SLICE_BYTES = 64 * 1024
INCOMPLETE_RESPONSE = "ASGI callable returned without completing response"


class DropLogFilter(logging.Filter):
    """uvicorn logs ERROR "ASGI callable returned without completing response." for every answer
    abandoned here (on purpose: the client did not read), one line per dropped client. One such
    record is dropped per answer this process abandoned (``dropped()``; the abandoning side logs
    its own warning, under the request log budget); any other is kept (a real app bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.pending = 0
        self.lock = threading.Lock()
        self.installed = False

    def install(self) -> None:
        if not self.installed:
            self.installed = True
            logging.getLogger("uvicorn.error").addFilter(self)

    def dropped(self) -> None:
        with self.lock:
            self.pending += 1

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(INCOMPLETE_RESPONSE):
            return True
        with self.lock:
            if self.pending <= 0:
                return True
            self.pending -= 1
            return False


DROPS = DropLogFilter()


class SendTimeout(Exception):
    """A write waited past ``limits.stream_send_timeout_s`` for a client that does not read."""


def deadline_send(send: Send, timeout_s: float, slice_bytes: int = SLICE_BYTES) -> Send:
    """``send`` with each message bounded by ``timeout_s`` (its slices share the deadline)."""
    DROPS.install()

    async def bounded(message: Message) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                body = message.get("body", b"") if message["type"] == "http.response.body" else b""
                if len(body) <= slice_bytes:
                    await send(message)
                    return
                more = message.get("more_body", False)
                view = memoryview(body)
                for start in range(0, len(body), slice_bytes):
                    last = start + slice_bytes >= len(body)
                    piece = bytes(view[start : start + slice_bytes])  # a copy: the buffer keeps only it
                    await send({"type": "http.response.body", "body": piece, "more_body": more or not last})
        except TimeoutError:
            DROPS.dropped()  # uvicorn's "returned without completing response" for it is expected
            raise SendTimeout(
                f"the client took none of a write within {timeout_s:g} s (limits.stream_send_timeout_s)"
            ) from None

    return bounded
