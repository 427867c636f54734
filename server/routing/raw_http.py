"""``raw`` upstream: persistent HTTP/1.1 connections to workers, parsed with httptools.

One idle-connection stack per worker (host, port); a request takes the most recently
used idle connection (or opens one), writes the request in one ``write``, and reads the
response through an ``asyncio.Protocol`` feeding httptools' C parser. Each wait (connect,
the headers, the next body chunk) has its own timer. A connection goes back to the stack
only after a complete response that allows keep-alive; idle ones older than
``IDLE_EXPIRY_S`` are dropped (workers close theirs after 5 s). A request that fails on a
reused connection before any response byte arrived is retried once on a new connection
(the worker closed the idle connection: it never saw the request). Body chunks are
buffered while the client is slower than the worker, reading paused above ``HIGH_WATER``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

from server.routing.upstream import Headers, UpstreamConnectError, UpstreamLost, UpstreamTimeout

IDLE_EXPIRY_S = 2.0
HIGH_WATER = 256 * 1024  # bytes of an answer buffered per request before reading pauses


class _Conn(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.headers_done = self.complete = self.closed = self.got_bytes = self.paused = False
        self.keep_alive = False
        self.error: Exception | None = None
        self.idle_since = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = UpstreamLost(f"bad HTTP from the worker: {exc}")
            self._close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if (
            exc is None
            and self.headers_done
            and not any(k in (b"content-length", b"transfer-encoding") for k, _ in self.headers)
        ):
            self.complete = True  # a body delimited by the end of the connection
        if not self.complete and self.error is None:
            self.error = UpstreamLost("the worker closed the connection")
        self._wake()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        # asked here: once the message is complete llhttp resets its flags, and
        # should_keep_alive() says False for every response (no connection was ever reused)
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True

    # helpers
    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def wait(self, timeout_s: float, what: str) -> None:
        self.waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout_s, self._timeout, self.waiter, what)
        try:
            await self.waiter
        finally:
            timer.cancel()
            self.waiter = None

    def _timeout(self, fut: asyncio.Future[None], what: str) -> None:
        if not fut.done():
            fut.set_exception(UpstreamTimeout(f"no {what} within the read timeout"))

    def reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers = []
        self.chunks.clear()
        self.buffered = 0
        self.headers_done = self.complete = self.got_bytes = self.keep_alive = False


class RawResponse:
    def __init__(self, upstream: RawUpstream, key: tuple[str, int], conn: _Conn) -> None:
        self._up, self._key, self._conn = upstream, key, conn
        self.status = conn.parser.get_status_code()
        self.headers = conn.headers
        self._released = False

    async def chunks(self) -> AsyncIterator[bytes]:
        c = self._conn
        while True:
            if c.chunks:
                chunk = c.chunks.popleft()
                c.buffered -= len(chunk)
                if c.paused and c.buffered < HIGH_WATER // 2 and c.transport is not None:
                    c.paused = False
                    c.transport.resume_reading()
                yield chunk
                continue
            if c.complete:
                return
            if c.error is not None:
                raise c.error
            await c.wait(self._up.read_timeout_s, "response bytes")

    async def read(self) -> bytes:
        """The whole body (a plain loop: no async generator for the common small JSON answer)."""
        c, parts = self._conn, []
        while True:
            while c.chunks:
                parts.append(c.chunks.popleft())
            c.buffered = 0
            if c.paused and c.transport is not None:  # all of it is wanted: read on
                c.paused = False
                c.transport.resume_reading()
            if c.complete:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            if c.error is not None:
                raise c.error
            await c.wait(self._up.read_timeout_s, "response bytes")

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        c = self._conn
        if c.complete and c.keep_alive and not c.closed and not c.chunks:
            c.reset()
            c.idle_since = time.monotonic()
            self._up.idle.setdefault(self._key, []).append(c)
        else:
            c._close()


class RawUpstream:
    def __init__(self, connect_timeout_s: float, read_timeout_s: float) -> None:
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.idle: dict[tuple[str, int], list[_Conn]] = {}
        self._addr: dict[str, tuple[str, int, bytes]] = {}

    def _parse(self, base_url: str) -> tuple[str, int, bytes]:
        addr = self._addr.get(base_url)
        if addr is None:
            u = urlsplit(base_url)
            if u.scheme != "http" or not u.hostname:
                raise UpstreamConnectError(
                    f"the raw upstream speaks plain http only, not {base_url!r}: "
                    "set routing.upstream: httpx for https workers"
                )
            port = u.port or 80
            addr = self._addr[base_url] = (u.hostname, port, f"{u.hostname}:{port}".encode())
        return addr

    async def _connect(self, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(loop), host, port), self.connect_timeout_s
            )
        except TimeoutError:
            raise UpstreamTimeout("connect timed out") from None
        except OSError as exc:
            raise UpstreamConnectError(f"{exc.strerror or exc}") from None
        return conn

    def _take_idle(self, key: tuple[str, int]) -> _Conn | None:
        stack = self.idle.get(key)
        now = time.monotonic()
        while stack:
            conn = stack.pop()
            if not conn.closed and now - conn.idle_since < IDLE_EXPIRY_S:
                return conn
            conn._close()
        return None

    async def send(
        self,
        base_url: str,
        method: str,
        target: str,
        headers: Headers,
        body: bytes,
    ) -> RawResponse:
        host, port, host_header = self._parse(base_url)
        key = (host, port)
        head = [
            f"{method} {target} HTTP/1.1\r\n".encode(),
            b"host: ",
            host_header,
            b"\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\n",
        ]
        for k, v in headers:
            head += [k, b": ", v, b"\r\n"]
        head.append(b"\r\n")
        data = b"".join(head) + body
        for attempt in (0, 1):
            conn = self._take_idle(key)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(host, port)
            assert conn.transport is not None
            conn.transport.write(data)
            try:
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(self.read_timeout_s, "response")
            except UpstreamLost:
                conn._close()
                if reused and not conn.got_bytes and attempt == 0:
                    continue  # a stale keep-alive connection: the worker never saw this request
                raise
            except BaseException:
                conn._close()
                raise
            return RawResponse(self, key, conn)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        for stack in self.idle.values():
            for conn in stack:
                conn._close()
        self.idle.clear()
