"""The router's hot path: ``/v1/*`` as plain ASGI (no FastAPI routing, no Request object).

Request lifecycle
  1. Auth at the edge (``server.auth.authenticate_key``: a bad key is a 401 here, no worker
     sees it); a POST without a JSON content type is a 415 and a Host a keyless router does not
     serve a 421 (``server/browser_guard.py``). The body is read once (413 past
     ``limits.max_request_bytes``).
  2. Keys (``request.py``: one ``RouteRequest`` per POST): the session key
     (``server.session_key``: prompt_cache_key, X-Session-ID, X-Claude-Code-Session-Id,
     metadata.user_id, user, previous_response_id, else the prefix hash), namespaced by tenant
     and placed by its digest (``SessionKey.placement``: a
     ``previous_response_id`` carries the digest of its session, so it lands where the session
     is), and, for policies that place by it, the prefix hash, namespaced by the tenant's cache
     namespace; two tenants that pick the same key are placed independently. Every POST under
     /v1 is placed this way: chat and text completions, ``/v1/responses``, ``/v1/messages`` and
     ``/v1/messages/count_tokens`` (the query, e.g. Claude Code's ``?beta=true``, is forwarded);
     and the conversation's turn (its assistant messages), for slow start and the graded bound.
     ``/v1/responses/{id}`` (GET, DELETE, ``/cancel``, ``/input_items``) is placed by the
     placement digest in the id, so it reaches the worker that stored the response.
  3. (``forward.py`` from here) The policy orders the healthy workers; the request goes to
     the first on a persistent upstream connection (``upstream.py``). If the worker cannot be
     reached, or drops the connection before anything was sent to the client, the next is
     tried (at most ``max_failovers`` more); a refused connection also takes the worker out.
  4. A JSON answer is relayed whole, status and body unchanged (4xx included). A stream
     (``text/event-stream``) is relayed as it arrives; if the worker fails mid-stream the
     stream ends with an OpenAI-shaped SSE error event and ``data: [DONE]``. Every relayed
     answer carries ``X-Agentserve-Worker``.
  5. A client disconnect cancels the upstream request (its connection is closed, so the
     worker stops generating). Every wait is bounded by the connect and read timeouts.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from starlette.types import Receive, Scope, Send

from server.auth import authenticate_key, cache_salt
from server.auth import router_headers as tenant_headers
from server.body_limit import too_slow
from server.browser_guard import content_type_refusal
from server.errors import AgentServeError, PayloadTooLarge
from server.routing.forward import HOP_HEADERS, REQUEST_PATH, ProxyCall, send_json
from server.routing.request import route_request, stored_response_route
from server.send_deadline import deadline_send
from server.session_key import CLAUDE_CODE_HEADER, HEADER

if TYPE_CHECKING:
    from server.routing.router import Router


# the request headers the router reads (ASGI header names are lower-case)
_READ_HEADERS = {name.encode(): name for name in ("authorization", "x-api-key", HEADER, CLAUDE_CODE_HEADER)}


async def proxy_request(router: Router, scope: Scope, receive: Receive, send: Send) -> None:
    t0 = time.perf_counter()
    REQUEST_PATH.set(scope["path"])  # errors from here on take the dialect's shape
    send = deadline_send(send, router.settings.limits.stream_send_timeout_s)  # server/send_deadline.py
    raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
    headers = {_READ_HEADERS[k]: v.decode("latin-1") for k, v in raw_headers if k in _READ_HEADERS}
    auth = router.settings.auth
    try:
        tenant = authenticate_key(headers, auth)
        content_type = next((v.decode("latin-1") for k, v in raw_headers if k == b"content-type"), None)
        wrong_type = content_type_refusal(scope["method"], content_type)  # server/browser_guard.py
        if wrong_type is not None:
            raise wrong_type
        limits = router.settings.limits
        try:
            async with asyncio.timeout(limits.body_timeout_s):
                body = await _read_body(receive, limits.max_request_bytes)
        except TimeoutError:
            raise too_slow(limits.body_timeout_s) from None
    except AgentServeError as exc:
        await send_json(send, exc.status, exc.body())
        return
    route = stored_response_route(scope["path"])  # GET/DELETE/cancel of a stored response: its worker
    if route is None and scope["method"] == "POST":
        route = route_request(body, headers, router.policy.uses_prefix, tenant, cache_salt(tenant, auth))
    out = [(k, v) for k, v in raw_headers if k not in HOP_HEADERS]
    out += tenant_headers(tenant, auth)
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    call = ProxyCall(router, scope["method"], target.decode("latin-1"), out, body, route, t0)
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
