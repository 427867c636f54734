"""Responses API WebSocket mode: ``/v1/responses`` upgraded to a WebSocket (what Codex CLI uses when
its provider declares ``supports_websockets``).

The protocol, as OpenAI documents it and Codex 0.169 speaks it:

- Each turn the client sends one JSON text message ``{"type": "response.create", ...}`` holding the
  fields of a ``POST /v1/responses`` body (``stream`` is implied and ignored; ``background`` is refused).
  The server answers with the same event objects as the SSE stream, one JSON text message per event,
  ending with ``response.completed``, ``response.incomplete`` or ``response.failed``. One response at a
  time: the next message is read once a response is done (one engine request per socket).
- ``previous_response_id``: the socket remembers its latest response (the conversation + its output),
  whatever ``store`` says, so a turn may send only its new input items; an older id made with
  ``store: true`` is found in the tenant's store as over HTTP. Unknown: an error message (400,
  ``previous_response_not_found``); send the whole conversation instead.
- ``generate: false`` (Codex's warm-up): nothing is generated; ``response.created``,
  ``response.in_progress`` and a ``response.completed`` with no output, whose id the next turn can
  continue from.
- ``response.processed`` (Codex's acknowledgement of a finished response) is accepted and ignored.
- A request the server refuses (bad body, unknown id, overload) is one message
  ``{"type": "error", "status": 4xx, "error": {"type", "code", "message", "param"}}`` (the shape Codex
  maps to an HTTP error); the socket stays open.
- Auth: the same keys as HTTP (``Authorization: Bearer`` or ``x-api-key``) at the upgrade; a bad key
  is refused before it (HTTP 401 where the server can send one, else close code 1008).

Serving a WebSocket needs uvicorn's WebSocket support (the ``websockets`` or ``wsproto`` package); without
it uvicorn refuses the upgrade and Codex falls back to HTTP streaming.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect

from server.api.responses import ResponseJob, response_store, stored_history
from server.api.routes import admit
from server.api.sse import Framing, sse_stream
from server.auth import authenticate
from server.errors import AgentServeError, InvalidRequest, PayloadTooLarge, internal_error_body

log = logging.getLogger(__name__)
router = APIRouter()
CLOSE_POLICY = 1008  # WebSocket close code: policy violation (a refused key)
IGNORED = ("response.processed",)  # client events that need no answer
TRANSPORT_ONLY = ("type", "stream", "generate")  # message fields that are not part of the body


@dataclass(frozen=True)
class JsonFraming(Framing):
    """One JSON text message per event (no SSE ``event:``/``data:`` lines)."""

    def frame(self, data: dict[str, Any] | str) -> str:
        return data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def error_message(exc: AgentServeError) -> dict[str, Any]:
    """A refused request as a WebSocket message: the HTTP status rides in the event."""
    return {"type": "error", "status": exc.status, **exc.body()}


class Socket:
    """One client's socket: its tenant and the latest response it may continue from."""

    def __init__(self, ws: WebSocket, tenant: str) -> None:
        self.ws, self.tenant = ws, tenant
        self.state = ws.app.state
        self.latest: tuple[str, list[Any]] | None = None  # (response id, conversation incl. its output)

    async def send(self, event: dict[str, Any] | str) -> None:
        await self.ws.send_text(event if isinstance(event, str) else json.dumps(event, ensure_ascii=False))

    def history(self, body: dict[str, Any]) -> list[Any] | None:
        prev = body.get("previous_response_id")
        if prev is not None and self.latest is not None and prev == self.latest[0]:
            return list(self.latest[1])
        try:
            return stored_history(response_store(self.state), self.tenant, body)
        except InvalidRequest as exc:
            exc.code = "previous_response_not_found"
            raise

    def remember(self, job: ResponseJob, response: dict[str, Any]) -> None:
        items = list(job.conv.input_items) + list(response.get("output") or [])
        self.latest = (response["id"], items)
        if job.body.get("store", True) is not False:
            response_store(self.state).put(self.tenant, job.conv.input_items, response)

    def parse(self, text: str) -> dict[str, Any] | None:
        """The response body of a client message; None for a message that needs no answer."""
        limit = self.state.settings.limits.max_request_bytes
        if len(text.encode()) > limit:
            raise PayloadTooLarge(f"the message is over {limit} bytes (limits.max_request_bytes)")
        try:
            message = json.loads(text)
        except ValueError:
            raise InvalidRequest(
                'the message is not valid JSON: send {"type": "response.create", "model": ..., "input": ...}'
            ) from None
        kind = message.get("type") if isinstance(message, dict) else None
        if kind in IGNORED:
            return None
        if kind != "response.create":
            raise InvalidRequest(
                f"unknown message type {kind!r}: this socket takes 'response.create' messages "
                "(the fields of a POST /v1/responses body)",
                param="type",
            )
        return message  # type: ignore[no-any-return]

    async def turn(self, message: dict[str, Any]) -> None:
        warm_up = message.get("generate") is False
        body = {k: v for k, v in message.items() if k not in TRANSPORT_ONLY}
        if not warm_up:
            body["stream"] = True
        log.debug(
            "responses websocket: response.create previous_response_id=%s input items=%s generate=%s",
            body.get("previous_response_id"),
            len(body["input"]) if isinstance(body.get("input"), list) else "-",
            message.get("generate", True),
        )
        job = ResponseJob(self.state.service, self.ws.headers, self.tenant, body, self.history(body))
        if warm_up:  # remember the conversation under a response id; generate nothing
            await asyncio.to_thread(job.prepare)
            for event in job.events.start() + job.events.finish_events():
                await self.send(event)
        else:
            prepared, ticket, deadline = await admit(self.state, job.prepare)
            chunks = job.to_stream(prepared, self.state.service.stream(prepared))
            framing = JsonFraming(done=False, error_event=job.events.failed_event)
            remaining = max(0.001, deadline - time.monotonic())
            async with aclosing(sse_stream(chunks, ticket, remaining, framing)) as frames:
                async for frame in frames:
                    await self.send(frame)
        if job.events.final is not None:
            self.remember(job, job.events.final)

    async def handle(self, text: str) -> None:
        try:
            message = self.parse(text)
            if message is not None:
                await self.turn(message)
        except AgentServeError as exc:
            await self.send(error_message(exc))
        except WebSocketDisconnect:
            raise
        except Exception as exc:  # never leave the client waiting for an answer
            log.exception("responses websocket: request failed")
            await self.send({"type": "error", "status": 500, **internal_error_body(exc)})


async def _refuse(ws: WebSocket, exc: AgentServeError) -> None:
    try:
        await ws.send_denial_response(JSONResponse(exc.body(), status_code=exc.status))
    except RuntimeError:  # the server cannot send an HTTP response instead of the upgrade
        await ws.close(code=CLOSE_POLICY, reason=exc.message[:120])


@router.websocket("/v1/responses")
async def responses_socket(ws: WebSocket) -> None:
    try:
        tenant = authenticate(ws.headers, ws.app.state.settings.auth)
    except AgentServeError as exc:
        await _refuse(ws, exc)
        return
    await ws.accept()
    socket = Socket(ws, tenant)
    try:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                await socket.send(error_message(InvalidRequest("send JSON text messages, not binary ones")))
                continue
            await socket.handle(text)
    except WebSocketDisconnect:
        return
