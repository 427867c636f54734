"""The worker's front door: the Host and content-type checks (``browser_guard.py``), auth (tenant),
the body-size limit by Content-Length, request counts, every 4xx logged with its reason
(``refusal_log.py``), every answer sent through one sender with a deadline (``send_deadline.py``: a
client that does not read is dropped); WebSockets counted and origin-checked before the route
(``ws_gate.py``).

A plain ASGI middleware, not Starlette's ``BaseHTTPMiddleware`` (``@app.middleware("http")``):
that one relays every message of a streamed response through an anyio memory stream and a
task of its own, on the event loop's thread, per token of every stream -- ~20 % of that
thread's time at 8 concurrent streams (py-spy, benchmarks/results/concurrent_sessions.md),
time the 2-core box's decode step then waits for. Here a response's messages go straight to
the server; the request is counted when its response starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.auth import authenticate, needs_key
from server.body_limit import too_large
from server.browser_guard import content_type_refusal, host_refusal
from server.config import Settings
from server.dialects.messages.error_shape import shape_error
from server.errors import AgentServeError
from server.log_budget import REQUEST_LOG
from server.metrics import Metrics
from server.refusal_log import MAX_BODY, RefusalLog
from server.send_deadline import SendTimeout, deadline_send
from server.ws_gate import SocketGate

log = logging.getLogger(__name__)


def route_label(scope: Scope, known: frozenset[str]) -> str:
    """The matched route's template, or a path that is one (a 401 before routing); never any other
    raw path: a client could mint unbounded series."""
    template = getattr(scope.get("route"), "path", None)
    if isinstance(template, str):
        return template
    path = scope["path"]
    return path if path in known else "other"


def route_paths(routes: list[Any]) -> frozenset[str]:
    """Every route path, routers included (FastAPI keeps an included router as one entry)."""
    out: set[str] = set()
    for route in routes:
        path = getattr(route, "path", "")
        if isinstance(path, str) and path:
            out.add(path)
        inner = getattr(route, "original_router", None)
        if inner is not None:
            out |= route_paths(list(inner.routes))
    return frozenset(out)


class FrontDoor:
    """Auth and the Content-Length limit before any route runs; every response counted by route."""

    def __init__(
        self, app: ASGIApp, settings: Settings, metrics: Metrics, paths: Callable[[], frozenset[str]]
    ):
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.paths = paths  # the app's route paths, asked at the first request (routes come after this)
        self._known: frozenset[str] | None = None
        self.sockets = SocketGate(settings)  # WebSockets: counted, origin-checked (ws_gate.py)
        self.refusals = RefusalLog()  # every 4xx in one line with its reason

    def _route(self, scope: Scope) -> str:
        if self._known is None:
            self._known = self.paths()
        return route_label(scope, self._known)

    def _count(self, scope: Scope, status: int) -> None:
        self.metrics.requests.labels(self._route(scope), str(status)).inc()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        headers = Headers(scope=scope)
        wrong_host = host_refusal(path, headers.get("host"), self.settings)  # browser_guard.py
        if scope["type"] == "websocket":
            try:  # whose socket it is, for its share (the route refuses a bad key itself)
                owner: str | None = authenticate(headers, self.settings.auth)
            except AgentServeError:
                owner = None
            await self.sockets(scope, receive, send, self.app, wrong_host, owner)
            return
        auth = self.settings.auth
        try:
            if wrong_host is not None:
                raise wrong_host
            tenant = authenticate(headers, auth) if needs_key(path, auth.protect_metrics) else ""
            scope.setdefault("state", {})["tenant"] = tenant  # request.state.tenant in the routes
            wrong_type = content_type_refusal(scope["method"], headers.get("content-type"))
            if wrong_type is not None:
                raise wrong_type
            length = headers.get("content-length")
            limit = self.settings.limits.max_request_bytes
            if length is not None and length.isdigit() and int(length) > limit:
                raise too_large(limit, length)
        except AgentServeError as exc:
            response = JSONResponse(shape_error(path, exc.status, exc.body()), status_code=exc.status)
            await response(scope, receive, send)
            self._count(scope, exc.status)
            if 400 <= exc.status < 500:
                self.refusals.record(exc.status, scope["method"], self._route(scope), exc.body())
            return

        refused: list[int] = []  # a 4xx's status, once its response starts
        body = bytearray()  # its first MAX_BODY bytes: the reason
        bounded = deadline_send(send, self.settings.limits.stream_send_timeout_s)

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                self._count(scope, status)
                if 400 <= status < 500:
                    refused.append(status)
            elif refused and message["type"] == "http.response.body":
                body.extend(message.get("body", b"")[: MAX_BODY - len(body)])
                if not message.get("more_body", False):
                    self.refusals.record(refused[0], scope["method"], self._route(scope), bytes(body))
            await bounded(message)

        try:
            await self.app(scope, receive, counted)
        except SendTimeout as exc:  # the answer is abandoned and freed; uvicorn closes the connection
            label = route_label(scope, frozenset())
            why = "%s %s: %s: the answer is dropped"
            REQUEST_LOG.log(log, logging.WARNING, why, scope["method"], label, exc)
