"""WebSockets inside the process's limits, for the worker (``front_door.py``) and the router
(``routing/websocket.py``) alike.

- **Counted.** uvicorn's ``limit_concurrency`` (``limits.max_connections``) is checked for HTTP
  requests only, but every open socket counts toward it: ~2,048 idle sockets made every HTTP
  request a 503, ``/health/live`` included. The gate counts open sockets and refuses an upgrade
  past ``websocket.max_sockets`` (default half of ``max_connections``), so HTTP keeps the rest:
  HTTP 503 + ``Retry-After`` in place of the 101 (close code 1013, "try again later", where the
  server cannot answer an upgrade with HTTP). Codex then falls back to HTTP streaming.
- **Origin.** A browser page can open a WebSocket to ``127.0.0.1`` (no CORS on upgrades) and read
  the replies. A request whose ``Origin`` is not in ``websocket.allowed_origins`` is refused (403,
  close code 1008) on a keyless server; a keyed one lets the key decide (a browser cannot send
  one on a WebSocket), unless ``allowed_origins`` is set. No ``Origin`` (Codex, SDKs): never refused.
- **Frames.** Per-message deflate is off (a ~15 KiB frame inflated to 16 MiB of work). A message
  over ``limits.max_request_bytes`` reaches the app and is answered with an error message (413);
  the transport's hard cap (``frame_limit``, twice that) ends only a socket that sends more
  (close code 1009). The 101 carries ``x-codex-websocket-max-message-bytes`` = the app's limit,
  which Codex 0.171 reads to refuse oversized messages before sending them.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from server.config import Settings
from server.errors import AgentServeError

log = logging.getLogger(__name__)
MAX_MESSAGE_HEADER = "x-codex-websocket-max-message-bytes"
CLOSE_POLICY = 1008  # a refused origin or key, where no HTTP answer can replace the upgrade
CLOSE_TRY_LATER = 1013  # too many sockets


class TooManySockets(AgentServeError):
    status = 503
    type = "server_error"
    default_code = "too_many_websockets"


class OriginNotAllowed(AgentServeError):
    status = 403
    type = "permission_error"
    default_code = "origin_not_allowed"


def socket_limit(settings: Settings) -> int:
    configured = settings.websocket.max_sockets
    return configured if configured is not None else max(1, settings.limits.max_connections // 2)


def frame_limit(settings: Settings) -> int:
    """The transport's hard cap on one message: past the app's limit, so an oversized message is
    still read and answered with an error message rather than ending the socket."""
    return 2 * settings.limits.max_request_bytes


def uvicorn_ws_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's WebSocket settings for a worker or a router (``uvicorn.run(..., **these)``)."""
    return {"ws_max_size": frame_limit(settings), "ws_per_message_deflate": False}


def accept_headers(settings: Settings) -> list[tuple[bytes, bytes]]:
    """Extra headers of the 101: the largest message the app takes."""
    return [(MAX_MESSAGE_HEADER.encode(), str(settings.limits.max_request_bytes).encode())]


def origin_refusal(origin: str | None, settings: Settings) -> OriginNotAllowed | None:
    """Why an upgrade with this ``Origin`` is refused; None when it may go on."""
    allowed = settings.websocket.allowed_origins
    if origin is None or "*" in allowed or origin in allowed:
        return None
    if not allowed and settings.auth.api_keys:
        return None  # the key decides
    return OriginNotAllowed(
        f"WebSocket from the browser origin {origin!r} refused: add it to websocket.allowed_origins "
        "(AGENTSERVE_WEBSOCKET__ALLOWED_ORIGINS='[\"" + origin + "\"]') to allow it"
    )


INCOMPLETE_HANDSHAKE = "ASGI callable returned without completing handshake"


class DenialLogFilter(logging.Filter):
    """uvicorn's ``websockets-sansio`` protocol (``--ws auto``'s choice) logs ERROR "ASGI callable
    returned without completing handshake." after every denial response, which it sent correctly: it
    never marks the handshake done (Kludex/uvicorn#3138, open). A socket flood was an ERROR flood.
    One such record is dropped per denial this process sent; any other is kept (a real app bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.pending = 0
        self.lock = threading.Lock()

    def denied(self) -> None:
        with self.lock:
            self.pending += 1

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(INCOMPLETE_HANDSHAKE):
            return True
        with self.lock:
            if self.pending <= 0:
                return True
            self.pending -= 1
            return False


DENIALS = DenialLogFilter()


async def refuse(ws: WebSocket, exc: AgentServeError, close_code: int) -> None:
    """Answer the upgrade with ``exc`` as HTTP (close code ``close_code`` where the server cannot)."""
    headers = {"Retry-After": "1"} if exc.status == 503 else None
    try:
        await ws.send_denial_response(JSONResponse(exc.body(), status_code=exc.status, headers=headers))
    except RuntimeError:  # no HTTP answer possible in place of the upgrade
        await ws.close(code=close_code, reason=exc.message[:120])
    else:
        DENIALS.denied()


class SocketGate:
    """Counts a process's open WebSockets and refuses an upgrade over the limit or from a refused origin."""

    def __init__(self, settings: Settings) -> None:
        logging.getLogger("uvicorn.error").addFilter(DENIALS)  # once: a logger keeps one of each
        self.settings = settings
        self.limit = socket_limit(settings)
        self.tenant_limit = max(1, math.ceil(settings.tenant_share() * self.limit))  # limits.tenant_share
        self.open = 0
        self.by_tenant: dict[str, int] = {}  # tenants with a socket open only
        self.refused = 0

    async def __call__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        app: ASGIApp,
        refused: AgentServeError | None = None,
        tenant: str | None = None,
    ) -> None:
        """``refused``: what the caller already refuses the upgrade for (a Host, browser_guard.py);
        ``tenant``: whose socket it is (None: not known yet, the route authenticates it)."""
        refused = refused or origin_refusal(Headers(scope=scope).get("origin"), self.settings)
        if refused is None and tenant is not None and self.by_tenant.get(tenant, 0) >= self.tenant_limit:
            refused = TooManySockets(
                f"this tenant has {self.tenant_limit} WebSockets open here, its share (limits.tenant_share "
                f"of websocket.max_sockets {self.limit}); close one, or use HTTP streaming"
            )
        if refused is not None:
            self.refused += 1
            log.warning("websocket refused: %s", refused.message)
            code = CLOSE_TRY_LATER if refused.status == 503 else CLOSE_POLICY
            await refuse(WebSocket(scope, receive, send), refused, code)
            return
        if self.open >= self.limit:
            self.refused += 1
            log.warning("websocket refused: %d sockets open (websocket.max_sockets)", self.open)
            busy = TooManySockets(
                f"too many WebSockets: {self.open} open (websocket.max_sockets {self.limit}); retry "
                "shortly, or use HTTP streaming"
            )
            await refuse(WebSocket(scope, receive, send), busy, CLOSE_TRY_LATER)
            return
        self.open += 1
        key = tenant if tenant is not None else ""
        counted = tenant is not None
        if counted:
            self.by_tenant[key] = self.by_tenant.get(key, 0) + 1
        try:
            await app(scope, receive, send)
        finally:
            self.open -= 1
            if counted:
                n = self.by_tenant[key] - 1
                if n > 0:
                    self.by_tenant[key] = n
                else:
                    del self.by_tenant[key]
