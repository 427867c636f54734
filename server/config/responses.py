"""responses and websocket: the Responses store and the Responses WebSocket."""

from __future__ import annotations

from pydantic import Field

from server.config.section import Section


class ResponsesSettings(Section):
    store_max_responses: int = Field(
        256, ge=0, description="Stored responses (store: true) kept per tenant; least recently used go first."
    )
    store_max_bytes: int = Field(
        64 * 2**20, ge=0, description="Bytes of stored conversations kept per tenant (JSON size)."
    )
    store_ttl_s: float | None = Field(
        86400.0,
        gt=0,
        description="Seconds a stored response is kept after it was stored (None: until the count or "
        "byte bound pushes it out); past it GET is a 404 and previous_response_id a 400.",
    )


class WebSocketSettings(Section):
    """The Responses WebSocket (``/v1/responses`` upgraded; server/ws_gate.py, server/api/responses_ws.py)."""

    max_sockets: int | None = Field(
        None,
        ge=1,
        description="Open WebSockets per process (worker or router); past it an upgrade is refused (HTTP "
        "503, or close code 1013 where the server cannot answer HTTP). None: half of "
        "limits.max_connections, so HTTP (/health/live included) keeps the other half (uvicorn counts "
        "sockets as connections).",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins (the Origin header, e.g. 'http://localhost:3000'; '*' = any) that may "
        "open a WebSocket. A client that sends no Origin (Codex, SDKs) is never refused by this. Empty: a "
        "server with auth.api_keys takes any origin (the key decides), a keyless one refuses every browser "
        "origin (HTTP 403): any web page could otherwise drive the model and read the replies.",
    )
    max_conversation_bytes: int = Field(
        16 * 2**20,
        ge=1024,
        description="The conversation one Responses WebSocket holds for its next previous_response_id turn "
        "(input items + output, JSON bytes): a turn that would grow it past this is an error message (400, "
        "code conversation_too_large) and the socket stays open.",
    )
    held_conversations_mb: int = Field(
        2048,
        ge=1,
        description="Memory (MiB) all sockets' held conversations may take together, charged at 6.5x their "
        "JSON bytes (the worst ratio measured, server/held_budget.py); one tenant holds at most "
        "limits.tenant_share of it. Past it a conversation is not held: its next turn is the 400 "
        "conversation_too_large.",
    )
