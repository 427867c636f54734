"""Responses API WebSocket mode: ``/v1/responses`` upgraded to a WebSocket (what Codex CLI uses when
its provider declares ``supports_websockets``).

The protocol, as OpenAI documents it and Codex 0.169 speaks it:

- Each turn the client sends one JSON text message ``{"type": "response.create", ...}`` holding the
  fields of a ``POST /v1/responses`` body (``stream`` is implied and ignored; ``background`` is refused).
  The server answers with the same event objects as the SSE stream, one JSON text message per event,
  ending with ``response.completed``, ``response.incomplete`` or ``response.failed``. One response at a
  time (one engine request per socket): messages sent meanwhile are answered in order once it is
  done, except ``response.interrupt``, read while the turn streams.
- ``response.interrupt`` (``response_id``: the streaming response): acknowledged at once with
  ``response.interrupt.accepted``; the engine request is cancelled and the turn ends with
  ``response.incomplete`` (``incomplete_details.reason: "interrupted"``; ``usage`` null). Any other
  id: an error message (400, ``response_not_found`` / ``response_already_completed``). See
  ``ws_interrupt.py``. A client that disconnects mid-stream cancels its engine request the same way.
- ``previous_response_id``: the socket remembers its latest response (the conversation + its output)
  in memory, whatever ``store`` says, so a turn may send only its new input items; only ``store:
  true`` puts it in the tenant's store, where an older id is found as over HTTP. Unknown: an error
  message (400, ``previous_response_not_found``); send the whole conversation instead. The held
  conversation is bounded by ``websocket.max_conversation_bytes`` (400 ``conversation_too_large``
  past it); its size is kept as it grows, and the conversation is converted off the event loop.
- ``generate: false`` (Codex's warm-up): nothing is generated; ``response.created``,
  ``response.in_progress`` and a ``response.completed`` with no output, whose id the next turn can
  continue from. It holds an admission ticket (a place in the queue) while it is prepared.
- ``response.processed`` (Codex's acknowledgement of a finished response) is accepted and ignored.
- A request the server refuses (bad body, unknown id, overload) is one message
  ``{"type": "error", "status": 4xx, "error": {"type", "code", "message", "param"}}`` (the shape Codex
  maps to an HTTP error); the socket stays open.
- Auth: the same keys as HTTP (``Authorization: Bearer`` or ``x-api-key``) at the upgrade; a bad key
  is refused before it (HTTP 401 where the server can send one, else close code 1008). The socket
  count and the ``Origin`` are checked before that (``server/ws_gate.py``). The 101 carries
  ``x-codex-websocket-max-message-bytes`` (``limits.max_request_bytes``): a larger message is an
  error message (413) and the socket stays open.

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
from starlette.websockets import WebSocketDisconnect

from server.admission import Ticket
from server.api.responses import ResponseJob
from server.api.routes import admit
from server.api.sse import Framing, sse_stream
from server.api.ws_conversation import Conversation
from server.api.ws_interrupt import ActiveTurn
from server.auth import authenticate
from server.chat.prepared import Prepared
from server.errors import AgentServeError, InvalidRequest, PayloadTooLarge, internal_error_body
from server.ws_gate import CLOSE_POLICY, accept_headers, refuse

log = logging.getLogger(__name__)
router = APIRouter()
IGNORED = ("response.processed",)  # client events that need no answer
INTERRUPT = "response.interrupt"
TRANSPORT_ONLY = ("type", "stream", "generate")  # message fields that are not part of the body
PARSE_OFF_LOOP = 256 * 1024  # characters: a longer message is parsed in a thread
SEND_GRACE_S = 1.0  # past the request's deadline, a send still blocked ends the socket
CLOSE_STALLED = 1008  # the close code given to a client that stopped reading


@dataclass(frozen=True)
class JsonFraming(Framing):
    """One JSON text message per event (no SSE ``event:``/``data:`` lines)."""

    def frame(self, data: dict[str, Any] | str) -> str:
        return data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def error_message(exc: AgentServeError) -> dict[str, Any]:
    """A refused request as a WebSocket message: the HTTP status rides in the event."""
    return {"type": "error", "status": exc.status, **exc.body()}


class Socket:
    """One client's socket: its tenant, the turn it streams and the latest response it may continue from."""

    def __init__(self, ws: WebSocket, tenant: str) -> None:
        self.ws, self.tenant = ws, tenant
        self.state = ws.app.state
        self.held = Conversation(self.state, tenant)  # the latest response, for previous_response_id
        self.active: ActiveTurn | None = None
        # messages read while a turn runs, answered in order after it (one: a client that sends
        # more waits, as over TCP)
        self.inbox: asyncio.Queue[dict[str, Any] | AgentServeError] = asyncio.Queue(maxsize=1)

    async def send(self, event: dict[str, Any] | str) -> None:
        await self.ws.send_text(event if isinstance(event, str) else json.dumps(event, ensure_ascii=False))

    # -- reading (also while a turn streams) -------------------------------------------------
    async def read(self) -> None:
        """Read the client's messages until it leaves: interrupts at once, the rest in order."""
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                parsed: dict[str, Any] | AgentServeError = InvalidRequest(
                    "send JSON text messages, not binary ones"
                )
            else:
                parsed = await self.decode(text)
            if isinstance(parsed, dict) and parsed.get("type") == INTERRUPT:
                await self.interrupt(parsed)
            else:
                await self.inbox.put(parsed)

    async def decode(self, text: str) -> dict[str, Any] | AgentServeError:
        limit = self.state.settings.limits.max_request_bytes
        if len(text) > limit or (4 * len(text) > limit and len(text.encode()) > limit):
            return PayloadTooLarge(
                f"the message is over {limit} bytes (limits.max_request_bytes; the handshake's "
                "x-codex-websocket-max-message-bytes)"
            )
        try:
            message = (
                await asyncio.to_thread(json.loads, text) if len(text) > PARSE_OFF_LOOP else json.loads(text)
            )
        except ValueError:
            return InvalidRequest(
                'the message is not valid JSON: send {"type": "response.create", "model": ..., "input": ...}'
            )
        if not isinstance(message, dict):
            return InvalidRequest(
                'send a JSON object: {"type": "response.create", "model": ..., "input": ...}'
            )
        return message

    async def interrupt(self, message: dict[str, Any]) -> None:
        rid, turn = message.get("response_id"), self.active
        if turn is None or (rid is not None and rid != turn.id):
            done = rid is not None and self.held.latest is not None and rid == self.held.latest.id
            await self.send(
                error_message(
                    InvalidRequest(
                        f"response.interrupt: response {rid!r} is not streaming on this socket"
                        + (" (it is already done)" if done else ""),
                        param="response_id",
                        code="response_already_completed" if done else "response_not_found",
                    )
                )
            )
            return
        await self.send(turn.interrupt(message))
        log.info(
            "responses websocket: %s interrupted by the client (response.interrupt): its engine request "
            "is cancelled",
            turn.id,
        )

    # -- answering, one message at a time ------------------------------------------------------
    async def process(self) -> None:
        while True:
            item = await self.inbox.get()
            if isinstance(item, AgentServeError):
                await self.send(error_message(item))
            else:
                await self.handle(item)

    async def handle(self, message: dict[str, Any]) -> None:
        try:
            kind = message.get("type")
            if kind in IGNORED:
                return
            if kind != "response.create":
                raise InvalidRequest(
                    f"unknown message type {kind!r}: this socket takes 'response.create' messages "
                    "(the fields of a POST /v1/responses body) and 'response.interrupt'",
                    param="type",
                )
            await self.turn(message)
        except AgentServeError as exc:
            await self.send(error_message(exc))
        except WebSocketDisconnect:
            raise
        except Exception as exc:  # never leave the client waiting for an answer
            log.exception("responses websocket: request failed")
            await self.send({"type": "error", "status": 500, **internal_error_body(exc)})

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
        made: list[tuple[ResponseJob, int]] = []

        def prepare() -> Prepared:
            made.append(self.held.job(self.ws.headers, body))
            return made[0][0].prepare()

        if warm_up:  # remember the conversation under a response id; generate nothing
            ticket = self.state.admission.reserve(self.tenant)  # a place in the queue while it is prepared
            try:
                await asyncio.to_thread(prepare)
            finally:
                ticket.release()
            job, nbytes = made[0]
            events = job.events.start() + job.events.finish_events()
            assert job.events.final is not None
            await asyncio.to_thread(self.held.remember, job, job.events.final, nbytes)
            for event in events:
                await self.send(event)
        else:
            prepared, ticket, deadline = await admit(self.state, prepare, self.tenant)
            try:
                await self.stream(*made[0], prepared, ticket, deadline)
            finally:
                ticket.release()  # (sse_stream releases it: this covers a failure before it starts)

    async def stream(
        self, job: ResponseJob, nbytes: int, prepared: Prepared, ticket: Ticket, deadline: float
    ) -> None:
        """The turn's events, each sent before the next is made; the response is held (and stored)
        before its terminal event goes out. One send blocked past
        ``limits.stream_send_timeout_s``, or the turn past the request's deadline (+ a grace second:
        the stream's own timeout speaks first), means a client that stopped reading: the socket is
        ended and the engine request and admission slot freed."""
        self.active = turn = ActiveTurn(job.ctx.id, job.events)
        remaining = max(0.001, deadline - time.monotonic())
        send_timeout = self.state.settings.limits.stream_send_timeout_s

        async def held(response: dict[str, Any]) -> None:
            await asyncio.to_thread(self.held.remember, job, response, nbytes)

        chunks = job.to_stream(prepared, self.state.service.stream(prepared, turn.stop), held)
        framing = JsonFraming(done=False, error_event=job.events.failed_event)
        try:
            async with asyncio.timeout(remaining + SEND_GRACE_S):
                async with aclosing(sse_stream(chunks, ticket, remaining, framing)) as frames:
                    async for frame in frames:
                        async with asyncio.timeout(send_timeout):  # one write, as on SSE
                            await self.send(frame)
        except TimeoutError:
            log.warning(
                "responses websocket: %s: the client stopped reading (a send blocked past "
                "limits.stream_send_timeout_s, or past the request's deadline): socket ended, "
                "engine request cancelled",
                turn.id,
            )
            raise WebSocketDisconnect(code=CLOSE_STALLED) from None
        finally:
            self.active = None


@router.websocket("/v1/responses")
async def responses_socket(ws: WebSocket) -> None:
    try:
        tenant = authenticate(ws.headers, ws.app.state.settings.auth)
    except AgentServeError as exc:
        await refuse(ws, exc, CLOSE_POLICY)
        return
    await ws.accept(headers=accept_headers(ws.app.state.settings))
    socket = Socket(ws, tenant)
    reading, answering = asyncio.create_task(socket.read()), asyncio.create_task(socket.process())
    try:
        await asyncio.wait((reading, answering), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if socket.active is not None and reading.done():
            log.info(
                "responses websocket: client left while %s streamed: engine request cancelled",
                socket.active.id,
            )
        for task in (reading, answering):  # a turn still running ends here: its engine request is cancelled
            task.cancel()
        for task in (reading, answering):
            try:
                await task
            except (asyncio.CancelledError, WebSocketDisconnect):
                pass
            except Exception:
                log.exception("responses websocket: the socket ended on an error")
        socket.held.close()  # its conversation's memory goes back to the budget (held_budget.py)
