"""Anthropic Messages routes: ``POST /v1/messages`` (also ``?beta=true``), ``/v1/messages/count_tokens``.

A thin adapter onto the chat pipeline (``serve_prepared``): the body is converted by
``server/dialects/messages``, prepared by ``ChatService.prepare_chat`` like any chat request
(same masks, cache and session key), and the chat completion or chunks converted back.
Errors on these paths are Anthropic-shaped (``app.py`` handlers via ``errors.shape_error``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request, Response

from server.api.routes import serve_prepared
from server.api.sse import Framing
from server.chat.limits import check_sent_tools
from server.chat.prepared import Prepared
from server.chat.service import ChatService
from server.dialects.messages.error_shape import stream_error_event
from server.dialects.messages.request import CountTokensBody, MessagesBody, convert
from server.dialects.messages.response import Reply, message
from server.dialects.messages.stream import message_events

router = APIRouter()
FRAMING = Framing(
    named_events=True, done=False, error_event=stream_error_event, keepalive_event={"type": "ping"}
)


@router.post("/v1/messages")
async def messages(body: MessagesBody, request: Request) -> Response:
    service: ChatService = request.app.state.service
    raw: dict[str, Any] = await request.json()
    check_sent_tools(raw.get("tools"), service.settings.limits)  # server tools too, before converting
    converted = await asyncio.to_thread(convert, body, raw)  # work in the size of the body: off the loop
    reply = Reply(
        body.model,
        body.max_tokens,
        converted.dropped_tools,
        converted.diagnostics,
        converted.chat.cache_compare_with,
        converted.warm_up,
    )
    tenant = request.state.tenant
    return await serve_prepared(
        request,
        lambda: service.prepare_chat(converted.chat, request.headers, tenant, converted.raw),
        to_json=lambda p, chat: message(p, reply, chat),
        to_stream=lambda p, chunks: message_events(p, reply, chunks),
        framing=FRAMING,
    )


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensBody, request: Request) -> dict[str, Any]:
    """The prompt's tokens as ``/v1/messages`` renders it (tool prefill included)."""
    service: ChatService = request.app.state.service
    raw: dict[str, Any] = await request.json()
    check_sent_tools(raw.get("tools"), service.settings.limits)
    converted = await asyncio.to_thread(convert, body, raw)
    converted.chat.stream = False
    tenant = request.state.tenant
    # counted in by admission like a request being prepared (429 past the queue): the render,
    # tokenize and grammar compiles of a flood of counts are bounded as a flood of requests is
    ticket = request.app.state.admission.reserve(tenant)
    try:
        prepared: Prepared = await asyncio.to_thread(
            service.prepare_chat, converted.chat, request.headers, tenant, converted.raw
        )
    finally:
        ticket.release()
    return {"input_tokens": len(prepared.prompt_ids)}
