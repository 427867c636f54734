"""The router's hot path: ``/v1/*`` as plain ASGI (no FastAPI routing, no Request object).

Request lifecycle
  1. Auth at the edge (``server.auth.authenticate_key``: a bad key is a 401 here, no worker
     sees it). The body is read once (413 past ``limits.max_request_bytes``).
  2. Keys: the session key (``server.session_key``: prompt_cache_key, X-Session-ID, user,
     else the prefix hash) and, for policies that place by it, the prefix hash; both are
     namespaced by tenant (the prefix by the tenant's cache namespace), so two tenants that
     pick the same key are placed independently.
  3. The policy orders the healthy workers; the request goes to the first on a persistent
     upstream connection (``upstream.py``). If the worker cannot be reached, or drops the
     connection before anything was sent to the client, the next is tried (at most
     ``max_failovers`` more); a refused connection also takes the worker out.
  4. A JSON answer is relayed whole, status and body unchanged (4xx included). A stream
     (``text/event-stream``) is relayed as it arrives; if the worker fails mid-stream the
     stream ends with an OpenAI-shaped SSE error event and ``data: [DONE]``. Every relayed
     answer carries ``X-Agentserve-Worker``.
  5. A client disconnect cancels the upstream request (its connection is closed, so the
     worker stops generating). Every wait is bounded by the connect and read timeouts.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.auth import TENANT_HEADER, TOKEN_HEADER, authenticate_key, cache_salt, namespaced_session
from server.auth import router_headers as tenant_headers
from server.errors import AgentServeError, PayloadTooLarge, UpstreamUnavailable
from server.routing.upstream import UpstreamConnectError, UpstreamLost, UpstreamTimeout
from server.session_key import prefix_hash, session_key

if TYPE_CHECKING:
    from server.routing.router import Router
    from server.routing.workers import Worker

WORKER_HEADER = "x-agentserve-worker"
_DROP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailers",
    b"transfer-encoding",
    b"upgrade",
    b"host",
    b"content-length",
    TENANT_HEADER.encode(),
    TOKEN_HEADER.encode(),
}


class LeanPath:
    """ASGI middleware: ``/v1/*`` is proxied here; everything else goes on to the FastAPI app."""

    def __init__(self, app: ASGIApp, router: Router) -> None:
        self.app, self.router = app, router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            await proxy_request(self.router, scope, receive, send)
        else:
            await self.app(scope, receive, send)


async def proxy_request(router: Router, scope: Scope, receive: Receive, send: Send) -> None:
    t0 = time.perf_counter()
    raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw_headers}
    auth = router.settings.auth
    try:
        tenant = authenticate_key(headers, auth)
        body = await _read_body(receive, router.settings.limits.max_request_bytes)
    except AgentServeError as exc:
        await send_json(send, exc.status, exc.body())
        return
    key = prefix = None
    new_session = is_first_turn(body)
    if scope["method"] == "POST":
        key, prefix = route_keys(body, headers, router.policy_uses_prefix)
        key = namespaced_session(tenant, key)
        prefix = namespaced_session(cache_salt(tenant, auth), prefix) if prefix is not None else None
    out = [(k, v) for k, v in raw_headers if k not in _DROP]
    out += tenant_headers(tenant, auth)
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    call = ProxyCall(
        router, scope["method"], target.decode("latin-1"), out, body, key, prefix, t0, new_session,
        assistant_turns(body),
    )
    await call(receive, send)


async def _read_body(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(
                f"request body is over {limit} bytes (limits.max_request_bytes): send a shorter conversation"
            )
        parts.append(chunk)
        if not message.get("more_body", False):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def is_first_turn(body: bytes) -> bool:
    """A chat request with no assistant message yet: a session's first turn (slow start lets only
    these onto a warming worker). Conservative: the bytes '"assistant"' anywhere mean no."""
    return b'"messages"' in body and b'"assistant"' not in body


def assistant_turns(body: bytes) -> int | None:
    """A chat request's turn: its assistant messages (counted as the bytes '"assistant"', so text
    quoting that word only makes the request look older: a looser load bound, never a stricter
    one); None for a request without messages."""
    return body.count(b'"assistant"') if b'"messages"' in body else None


def route_keys(body: bytes, headers: dict[str, str], with_prefix: bool) -> tuple[str, str | None]:
    """(session key, prefix hash or None), parsing the JSON body only when it can matter."""
    if not with_prefix and b'"prompt_cache_key"' not in body and "x-session-id" in headers:
        return session_key({}, headers).key, None  # the header wins when the body has no prompt_cache_key
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        parsed = {}  # the worker will answer 400; route it somewhere stable
    if not isinstance(parsed, dict):
        parsed = {}
    return session_key(parsed, headers).key, prefix_hash(parsed) if with_prefix else None


class _Retry(Exception):
    """This worker failed before anything reached the client: try the next."""


class ProxyCall:
    """One proxied request; watches for the client disconnect while it runs."""

    def __init__(
        self,
        router: Router,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        key: str | None,
        prefix: str | None,
        t0: float,
        new_session: bool = True,
        turns: int | None = None,
    ) -> None:
        self.router, self.method, self.target, self.headers = router, method, target, headers
        self.body, self.key, self.prefix, self.t0 = body, key, prefix, t0
        self.new_session = new_session
        self.turns = turns

    async def __call__(self, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        state = {"gone": False, "finished": False}

        async def watch_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not state["finished"]:
                state["gone"] = True
                task.cancel()  # closes the upstream connection: the worker stops

        async def tracked_send(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                state["finished"] = True  # from here on a "disconnect" is just the end of the response

        watcher = asyncio.get_running_loop().create_task(watch_disconnect())
        try:
            await self._run(tracked_send)
        except asyncio.CancelledError:
            if not state["gone"]:
                raise
            task.uncancel()
        except OSError:  # the client went away while we were sending
            pass
        finally:
            state["finished"] = True
            watcher.cancel()

    async def _run(self, send: Send) -> None:
        m = self.router.metrics
        try:
            order, outcome = self.router.plan(self.key, self.prefix, self.new_session, self.turns)
        except UpstreamUnavailable as exc:
            m.upstream_errors.labels("none", "no_worker").inc()
            await send_json(send, exc.status, exc.body())
            return
        if outcome is not None:
            m.affinity.labels(outcome).inc()
        failures: list[str] = []
        for n, worker in enumerate(order):
            if n and not worker.healthy:
                continue  # taken out while we were trying another
            try:
                await self._attempt(worker, send)
                return
            except _Retry as exc:
                failures.append(f"{worker.id}: {exc}")
                m.failovers.labels(worker.id).inc()
        exc = UpstreamUnavailable(
            "no worker could take the request (" + "; ".join(failures) + "); retry shortly"
        )
        await send_json(send, exc.status, exc.body())

    async def _attempt(self, worker: Worker, send: Send) -> None:
        router, m = self.router, self.router.metrics
        worker.in_flight += 1
        status = "error"
        try:
            t_forward = time.perf_counter()
            try:
                resp = await router.upstream.send(
                    worker.url, self.method, self.target, self.headers, self.body
                )
            except UpstreamConnectError as exc:  # refused / unreachable: the worker is gone
                router.pool.mark_down(worker, f"connect failed: {exc}")
                m.upstream_errors.labels(worker.id, "connect").inc()
                raise _Retry(f"cannot connect ({exc})") from None
            except UpstreamTimeout as exc:
                await self._timeout(worker, send, exc)
                return
            except UpstreamLost as exc:
                m.upstream_errors.labels(worker.id, "disconnect").inc()
                raise _Retry(f"connection lost before an answer ({exc})") from None
            try:
                status = str(resp.status)
                headers = [(k, v) for k, v in resp.headers if k not in _DROP]
                headers.append((WORKER_HEADER.encode(), worker.id.encode()))
                if resp.status >= 500:
                    m.upstream_errors.labels(worker.id, "status_5xx").inc()
                is_stream = any(
                    k == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers
                )
                chunks = resp.chunks()
                try:
                    first = await anext(chunks, b"") if is_stream else b"".join([c async for c in chunks])
                except UpstreamTimeout as exc:
                    await self._timeout(worker, send, exc)
                    return
                except UpstreamLost as exc:
                    m.upstream_errors.labels(worker.id, "disconnect").inc()
                    raise _Retry(f"connection lost before an answer ({exc})") from None
                t_answer = time.perf_counter()
                if not is_stream:
                    headers.append((b"content-length", str(len(first)).encode()))
                await send({"type": "http.response.start", "status": resp.status, "headers": headers})
                if not is_stream:
                    await send({"type": "http.response.body", "body": first})
                    m.added_latency.observe((t_forward - self.t0) + (time.perf_counter() - t_answer))
                    return
                relay = _EventRelay(send)
                await relay.push(first)
                m.added_latency.observe((t_forward - self.t0) + (time.perf_counter() - t_answer))
                try:
                    async for chunk in chunks:
                        await relay.push(chunk)
                except (UpstreamLost, UpstreamTimeout) as exc:
                    m.upstream_errors.labels(worker.id, "midstream").inc()
                    status = "midstream_error"
                    what = "stopped answering" if isinstance(exc, UpstreamTimeout) else "failed"
                    await relay.fail(
                        UpstreamUnavailable(
                            f"worker {worker.id} {what} mid-stream ({exc}); the answer is incomplete: "
                            "retry the request"
                        )
                    )
                    return
                await relay.finish()
            finally:
                await resp.aclose()
        finally:
            worker.in_flight -= 1
            m.requests.labels(worker.id, status).inc()

    async def _timeout(self, worker: Worker, send: Send, exc: Exception) -> None:
        self.router.metrics.upstream_errors.labels(worker.id, "timeout").inc()
        rs = self.router.settings.routing
        err = UpstreamUnavailable(
            f"worker {worker.id} did not answer in time ({exc}; limits: "
            f"routing.connect_timeout_s={rs.connect_timeout_s}, routing.read_timeout_s={rs.read_timeout_s})",
            code="upstream_timeout",
        )
        await send_json(send, err.status, err.body())


class _EventRelay:
    """Forwards SSE bytes as they come, holding back only an incomplete trailing event, so
    that an error event can always be appended on a clean event boundary."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.pending = b""

    async def push(self, chunk: bytes) -> None:
        data = self.pending + chunk if self.pending else chunk
        cut = max(data.rfind(b"\n\n") + 2, data.rfind(b"\r\n\r\n") + 4, 0)
        if cut < 2:
            cut = 0
        self.pending = data[cut:]
        if cut:
            await self.send({"type": "http.response.body", "body": data[:cut], "more_body": True})

    async def finish(self) -> None:
        await self.send({"type": "http.response.body", "body": self.pending, "more_body": False})

    async def fail(self, err: AgentServeError) -> None:
        event = b"data: " + json.dumps(err.body()).encode() + b"\n\ndata: [DONE]\n\n"
        await self.send({"type": "http.response.body", "body": event, "more_body": False})


async def send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
