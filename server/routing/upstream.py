"""The proxy's upstream HTTP client: one small interface, three implementations.

``Upstream.send(base_url, method, target, headers, body)`` returns an ``UpstreamResponse``
once the status line and headers arrived; its body is read with ``chunks()`` (bytes as they
come; each wait bounded by the read timeout) and the response is released with
``aclose()`` (a connection is reused only after a complete response: one closed early
is dropped, so the worker sees the disconnect and stops). Failures are one of three
exceptions, so the router needs no client-specific code:

  UpstreamConnectError  nothing was sent (refused, unreachable): take the worker out, retry
  UpstreamTimeout       connect or read took longer than its limit
  UpstreamLost          the connection broke (before or after the headers)

Implementations (built by name in ``routing/clients.py``; measured in benchmarks/fleet/routing_bench.py):
  raw      persistent HTTP/1.1 connections with the httptools parser (``raw_http.py``)
  aiohttp  aiohttp.ClientSession, keep-alive connector, no cookie jar
  httpx    httpx.AsyncClient (the previous hot path)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

Headers = Sequence[tuple[bytes, bytes]]


class UpstreamError(Exception):
    pass


class UpstreamConnectError(UpstreamError):
    pass


class UpstreamTimeout(UpstreamError):
    pass


class UpstreamLost(UpstreamError):
    pass


class UpstreamResponse(Protocol):
    status: int
    headers: list[tuple[bytes, bytes]]  # names lower-case

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def read(self) -> bytes: ...  # the whole body (what chunks() would give, joined)

    async def aclose(self) -> None: ...


class Upstream(Protocol):
    async def send(
        self,
        base_url: str,
        method: str,
        target: str,
        headers: Headers,
        body: bytes,
    ) -> UpstreamResponse: ...

    async def close(self) -> None: ...
