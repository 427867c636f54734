"""The router's WebSocket path: ``/v1/responses`` upgraded (Codex's Responses WebSocket mode).

Lifecycle of one socket
  0. The router's gate (``server/ws_gate.py``): past ``websocket.max_sockets`` open sockets, or from a
     browser origin not allowed, the upgrade is refused (HTTP 503 / 403; close code 1013 / 1008).
  1. Auth before the upgrade (``server.auth.authenticate_key``: ``Authorization: Bearer`` or
     ``x-api-key``): a bad key is an HTTP 401 in place of the upgrade (close code 1008 where the
     server cannot send one); no worker sees it.
  2. The client's socket is accepted and its first message read: placement needs the session, and
     the session is in that message (``prompt_cache_key`` of the first ``response.create``, else the
     session headers, else ``previous_response_id``'s session, else the prefix hash): the same
     ``route_request`` and policy as an HTTP POST, so a socket lands where the session's HTTP
     requests (and its stored responses) are.
  3. A WebSocket to the first worker of the policy's order (the next while a worker cannot be
     reached, at most ``max_failovers`` more), with the client's headers (less the handshake's own)
     and the router's tenant headers; the first message is sent on it.
  4. Messages are relayed both ways as they come, text as text, binary as binary, until either
     side closes; the other is then closed with the same code (a worker's abnormal end is 1011 to
     the client). The whole socket stays on its worker: the worker keeps the socket's latest
     response, which a ``previous_response_id`` turn continues from.
  5. No worker reachable: one error message in the worker's shape (``{"type": "error", "status":
     503, "error": {...}}``), then close code 1013 (try again later).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from server.auth import authenticate_key, cache_salt
from server.auth import router_headers as tenant_headers
from server.errors import AgentServeError, UpstreamUnavailable
from server.routing.forward import HOP_HEADERS
from server.routing.request import route_request
from server.session_key import CLAUDE_CODE_HEADER, HEADER
from server.ws_gate import CLOSE_POLICY, accept_headers, refuse

if TYPE_CHECKING:
    from server.routing.router import Router
    from server.routing.workers import Worker

log = logging.getLogger("agentserve.routing")
PATH = "/v1/responses"
CLOSE_ERROR = 1011  # the worker's socket ended abnormally
CLOSE_TRY_LATER = 1013  # no worker could take the socket
_READ_HEADERS = {name.encode(): name for name in ("authorization", "x-api-key", HEADER, CLAUDE_CODE_HEADER)}
# the handshake's own headers: the upstream connection makes its own
_NOT_FORWARDED = HOP_HEADERS | {b"origin", b"user-agent"}


async def serve_websocket(
    router: Router, scope: Scope, receive: Receive, send: Send, refused: AgentServeError | None = None
) -> None:
    """A client's socket, counted and origin-checked by the router's gate (``server/ws_gate.py``);
    ``refused``: why the router already refuses it (its Host, ``server/browser_guard.py``)."""

    async def proxied(scope: Scope, receive: Receive, send: Send) -> None:
        await proxy_websocket(router, scope, receive, send)

    raw: list[tuple[bytes, bytes]] = scope["headers"]
    headers = {_READ_HEADERS[k]: v.decode("latin-1") for k, v in raw if k in _READ_HEADERS}
    try:  # whose socket it is, for its share (proxy_websocket refuses a bad key itself)
        owner: str | None = authenticate_key(headers, router.settings.auth)
    except AgentServeError:
        owner = None
    await router.sockets(scope, receive, send, proxied, refused, owner)


async def proxy_websocket(router: Router, scope: Scope, receive: Receive, send: Send) -> None:
    ws = WebSocket(scope, receive, send)
    raw: list[tuple[bytes, bytes]] = scope["headers"]
    headers = {_READ_HEADERS[k]: v.decode("latin-1") for k, v in raw if k in _READ_HEADERS}
    auth = router.settings.auth
    try:
        tenant = authenticate_key(headers, auth)
    except AgentServeError as exc:
        await _refuse(ws, exc)
        return
    await ws.accept(headers=accept_headers(router.settings))
    first = await ws.receive()
    if first["type"] == "websocket.disconnect":
        return
    data: str | bytes = first["text"] if first.get("text") is not None else first.get("bytes") or b""
    body = data.encode() if isinstance(data, str) else data
    route = route_request(body, headers, router.policy.uses_prefix, tenant, cache_salt(tenant, auth))
    out = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw if _forwarded(k)]
    out += [(k.decode(), v.decode()) for k, v in tenant_headers(tenant, auth)]
    try:
        order, outcome = router.plan(route)
        if outcome is not None:
            router.metrics.placed(outcome)
        worker, upstream = await _connect(router, order, out)
    except UpstreamUnavailable as exc:
        router.metrics.upstream_errors.labels("none", "no_worker").inc()
        await ws.send_text(json.dumps({"type": "error", "status": exc.status, **exc.body()}))
        await ws.close(CLOSE_TRY_LATER)
        return
    async with upstream:
        try:
            await upstream.send(data)
        except ConnectionClosed:  # the worker closed at once: the relay passes its close on
            pass
        await _relay(ws, upstream)
    router.metrics.request_done(worker.id, "websocket")


def _forwarded(name: bytes) -> bool:
    return name not in _NOT_FORWARDED and not name.startswith(b"sec-websocket-")


async def _refuse(ws: WebSocket, exc: AgentServeError) -> None:
    await refuse(ws, exc, CLOSE_POLICY)


async def _connect(
    router: Router, order: list[Worker], headers: list[tuple[str, str]]
) -> tuple[Worker, ClientConnection]:
    """A WebSocket to the first worker of ``order`` that takes it."""
    rs, failures = router.settings.routing, []
    for n, worker in enumerate(order):
        if n and not worker.healthy:
            continue
        url = "ws" + worker.url.removeprefix("http").rstrip("/") + PATH
        try:
            conn = await connect(
                url,
                additional_headers=headers,
                open_timeout=rs.connect_timeout_s,
                ping_interval=None,  # the client keeps its own socket alive; a long prefill is no fault
                max_size=None,  # the worker's events are trusted (its own limits apply to requests)
                compression=None,  # no per-message deflate (server/ws_gate.py)
                user_agent_header=dict(headers).get("user-agent"),
            )
        except InvalidStatus as exc:  # the worker refused the upgrade: a failure of this worker
            failures.append(f"{worker.id}: upgrade refused (HTTP {exc.response.status_code})")
        except (TimeoutError, InvalidHandshake) as exc:  # before OSError: TimeoutError is one
            router.metrics.upstream_errors.labels(worker.id, "connect").inc()
            failures.append(f"{worker.id}: no WebSocket handshake ({exc!r})")
        except OSError as exc:  # refused / unreachable: the worker is gone, as on the HTTP path
            router.pool.mark_down(worker, f"connect failed: {exc}")
            router.metrics.upstream_errors.labels(worker.id, "connect").inc()
            failures.append(f"{worker.id}: cannot connect ({exc})")
        else:
            return worker, conn
        router.metrics.failovers.labels(worker.id).inc()
    tried = "; ".join(failures)
    raise UpstreamUnavailable(f"no worker could take the WebSocket ({tried}); retry shortly")


async def _relay(ws: WebSocket, upstream: ClientConnection) -> None:
    """Messages both ways until one side closes; the other is closed with its code."""
    to_worker = asyncio.create_task(_client_to_worker(ws, upstream))
    to_client = asyncio.create_task(_worker_to_client(ws, upstream))
    done, pending = await asyncio.wait((to_worker, to_client), return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.warning("router: websocket relay ended on an error", exc_info=task.exception())
    await upstream.close()  # the client left (or the worker did: then a no-op)
    if to_client in done:  # the worker closed: close the client the same way
        code = upstream.close_code
        await _close(ws, 1000 if code == 1005 else CLOSE_ERROR if code in (None, 1006, 1015) else code)


async def _client_to_worker(ws: WebSocket, upstream: ClientConnection) -> None:
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        payload: Any = message.get("text") if message.get("text") is not None else message.get("bytes")
        try:
            await upstream.send(payload)
        except ConnectionClosed:
            return


async def _worker_to_client(ws: WebSocket, upstream: ClientConnection) -> None:
    try:
        async for message in upstream:
            if isinstance(message, str):
                await ws.send_text(message)
            else:
                await ws.send_bytes(message)
    except ConnectionClosed:
        return


async def _close(ws: WebSocket, code: int) -> None:
    try:
        await ws.close(code)
    except (RuntimeError, WebSocketDisconnect, OSError):  # already closed
        pass
