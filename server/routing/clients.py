"""The upstream clients by name (``make_upstream``): raw (``raw_http.py``), aiohttp and httpx, each an
``Upstream`` (``upstream.py``: the interface and its three errors)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from server.routing.raw_http import RawUpstream
from server.routing.upstream import (
    Headers,
    Upstream,
    UpstreamConnectError,
    UpstreamError,
    UpstreamLost,
    UpstreamTimeout,
)


def make_upstream(kind: str, connect_timeout_s: float, read_timeout_s: float) -> Upstream:
    if kind == "raw":
        return RawUpstream(connect_timeout_s, read_timeout_s)
    if kind == "aiohttp":
        return _AiohttpUpstream(connect_timeout_s, read_timeout_s)
    if kind == "httpx":
        return _HttpxUpstream(connect_timeout_s, read_timeout_s)
    raise ValueError(f"unknown upstream client {kind!r}: use raw, aiohttp or httpx")


class _HttpxResponse:
    def __init__(self, resp, errors) -> None:  # type: ignore[no-untyped-def]
        self._resp, self._errors = resp, errors
        self.status = resp.status_code
        self.headers = [(k.lower(), v) for k, v in resp.headers.raw]

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.aiter_raw():
                yield chunk
        except Exception as exc:
            raise self._errors(exc) from None

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    async def aclose(self) -> None:
        await self._resp.aclose()


class _HttpxUpstream:
    def __init__(self, connect_timeout_s: float, read_timeout_s: float) -> None:
        import httpx

        self._httpx = httpx
        timeout = httpx.Timeout(
            connect=connect_timeout_s, read=read_timeout_s, write=read_timeout_s, pool=connect_timeout_s
        )
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0)
        self._client = httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False)

    def _map(self, exc: Exception) -> UpstreamError:
        httpx = self._httpx
        if isinstance(exc, httpx.ConnectError):
            return UpstreamConnectError(str(exc) or type(exc).__name__)
        if isinstance(exc, httpx.TimeoutException):
            return UpstreamTimeout(type(exc).__name__)
        if isinstance(exc, httpx.TransportError):
            return UpstreamLost(type(exc).__name__)
        raise exc

    async def send(
        self,
        base_url: str,
        method: str,
        target: str,
        headers: Headers,
        body: bytes,
    ) -> _HttpxResponse:
        request = self._client.build_request(method, base_url + target, headers=list(headers), content=body)
        try:
            resp = await self._client.send(request, stream=True)
        except Exception as exc:
            raise self._map(exc) from None
        return _HttpxResponse(resp, self._map)

    async def close(self) -> None:
        await self._client.aclose()


class _AiohttpResponse:
    def __init__(self, resp, errors) -> None:  # type: ignore[no-untyped-def]
        self._resp, self._errors = resp, errors
        self.status = resp.status
        self.headers = [(k.lower(), v) for k, v in resp.raw_headers]

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except Exception as exc:
            raise self._errors(exc) from None

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    async def aclose(self) -> None:
        self._resp.release() if self._resp.content.at_eof() else self._resp.close()


class _AiohttpUpstream:
    def __init__(self, connect_timeout_s: float, read_timeout_s: float) -> None:
        import aiohttp

        self._aiohttp = aiohttp
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _map(self, exc: Exception) -> UpstreamError:
        import asyncio

        aiohttp = self._aiohttp
        if isinstance(exc, aiohttp.ClientConnectorError):
            return UpstreamConnectError(str(exc))
        if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
            return UpstreamTimeout(type(exc).__name__)
        if isinstance(exc, aiohttp.ClientError):
            return UpstreamLost(type(exc).__name__)
        raise exc

    async def send(
        self,
        base_url: str,
        method: str,
        target: str,
        headers: Headers,
        body: bytes,
    ) -> _AiohttpResponse:
        aiohttp = self._aiohttp
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        hdrs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        try:
            resp = await self._session.request(
                method, base_url + target, headers=hdrs, data=body, allow_redirects=False
            )
        except Exception as exc:
            raise self._map(exc) from None
        return _AiohttpResponse(resp, self._map)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
