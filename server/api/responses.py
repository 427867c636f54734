"""OpenAI Responses API routes: ``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``.

A thin adapter: the body becomes a chat request (``server/dialects/responses``), which is
served by ``serve_prepared`` (the chat pipeline: prepare → masks → engine → cache report);
the chat result comes back as a ``response`` object or as Responses stream events.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError

from server.api.routes import json_bytes, serve_prepared
from server.api.sse import Framing
from server.chat.limits import check_sent_tools
from server.chat.prepared import Prepared
from server.chat.service import ChatService
from server.dialects.responses.request import to_chat
from server.dialects.responses.response import ResponseContext, from_chat
from server.dialects.responses.response_store import ResponseStore
from server.dialects.responses.stream import ResponsesStream
from server.errors import InvalidRequest, NotFound
from server.protocol import ChatCompletionRequest
from server.session_key import response_id

router = APIRouter()
# chat field names in validation messages → the Responses names the client sent
PARAM_NAMES = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}


def _store(request: Request) -> ResponseStore:
    return response_store(request.app.state)


def response_store(state: Any) -> ResponseStore:
    """The app's bounded store of responses (``store: true``), made on first use."""
    store: ResponseStore | None = getattr(state, "responses_store", None)
    if store is None:
        cfg = state.settings.responses
        store = state.responses_store = ResponseStore(
            cfg.store_max_responses, cfg.store_max_bytes, cfg.store_ttl_s
        )
    return store


PARSE_OFF_LOOP = 256 * 1024  # bytes: a larger body is parsed in a thread (the event loop serves others)


async def request_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = await asyncio.to_thread(json.loads, raw) if len(raw) > PARSE_OFF_LOOP else json.loads(raw)
    except ValueError:
        raise InvalidRequest(
            "the request body is not valid JSON: send a JSON object with 'model' and 'input'"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object with 'model' and 'input'")
    return body


def _chat_request(chat: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first.get("loc", ())]
        if loc:
            loc[0] = PARAM_NAMES.get(loc[0], loc[0])
        param = ".".join(loc) or None
        more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
        raise InvalidRequest(
            f"invalid request: {param or 'body'}: {first.get('msg')}{more}", param=param
        ) from None


def stored_history(store: ResponseStore, tenant: str, body: dict[str, Any]) -> list[Any] | None:
    prev = body.get("previous_response_id")
    if prev is None:
        return None
    found = store.get(tenant, prev) if isinstance(prev, str) else None
    if found is None:
        raise InvalidRequest(
            f"previous_response_id {prev!r} is not stored here (unknown, evicted, from a worker restart, "
            "or created with store: false): send the whole conversation in input instead",
            param="previous_response_id",
        )
    return found.items


class ResponseJob:
    """One Responses request, transport aside: the chat request, how to prepare it, and how the
    chat reply becomes a ``response`` object or Responses events (HTTP and WebSocket share it)."""

    def __init__(
        self,
        service: ChatService,
        headers: Mapping[str, str],
        tenant: str,
        body: dict[str, Any],
        history: list[Any] | None,
        chat_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.service, self.headers, self.tenant, self.body = service, headers, tenant, body
        check_sent_tools(body.get("tools"), service.settings.limits)  # hosted ones too, before converting
        self.conv = to_chat(body, history)
        self.conv.chat.update(chat_overrides or {})
        self.req = _chat_request(self.conv.chat)
        compare = self.req.comparison_response_id()
        found = compare is not None and service.cache_report.responses.get(tenant, compare) is not None
        self.ctx = ResponseContext(
            id="", created_at=0, body=body, names=self.conv.names, compare_id=compare, compare_found=found
        )
        self.events = ResponsesStream(self.ctx)

    def prepare(self) -> Prepared:
        prev = self.body.get("previous_response_id")
        previous = prev if isinstance(prev, str) else None  # its session's previous tools (kept_tools.py)
        p = self.service.prepare_chat(self.req, self.headers, self.tenant, self.conv.chat, previous)
        p.request_id = self.ctx.id = response_id(p.session)  # the cache report keeps it under this id
        self.ctx.created_at = p.created
        return p

    def to_json(self, p: Prepared, chat: dict[str, Any]) -> dict[str, Any]:
        return from_chat(self.ctx, chat)

    async def to_stream(
        self,
        p: Prepared,
        chunks: AsyncIterator[dict[str, Any]],
        on_final: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """The Responses events; ``on_final`` (the store's copy) is awaited before the terminal event
        goes out, so a GET or the next turn sent on seeing it finds the response."""
        async for ev in self.events.events(chunks):
            final: dict[str, Any] | None = self.events.final
            if on_final is not None and ev.get("response") is final and final is not None:
                await on_final(final)
            yield ev


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    service: ChatService = request.app.state.service
    tenant: str = request.state.tenant
    store = _store(request)
    body = await request_body(request)
    history = stored_history(store, tenant, body)
    # converting the input items and tools is work in the size of the body: off the event loop
    job = await asyncio.to_thread(ResponseJob, service, request.headers, tenant, body, history)
    keep = body.get("store", True) is not False

    def to_json(p: Prepared, chat: dict[str, Any]) -> dict[str, Any]:
        response = job.to_json(p, chat)
        if keep:
            store.put(tenant, job.conv.input_items, response)
        return response

    async def stored(response: dict[str, Any]) -> None:
        if keep:  # off the event loop: it encodes the whole conversation
            await asyncio.to_thread(store.put, tenant, job.conv.input_items, response)

    def to_stream(p: Prepared, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        return job.to_stream(p, chunks, stored)

    framing = Framing(named_events=True, done=False, error_event=job.events.failed_event)
    return await serve_prepared(request, job.prepare, to_json, to_stream, framing)


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> Response:
    found = _store(request).get(request.state.tenant, response_id)
    if found is None:
        raise NotFound(
            f"response {response_id!r} is not stored here (unknown, evicted, or created with store: false)"
        )
    return Response(await asyncio.to_thread(json_bytes, found.response), media_type="application/json")


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    if not _store(request).delete(request.state.tenant, response_id):
        raise NotFound(
            f"response {response_id!r} is not stored here (unknown, evicted, or created with store: false)"
        )
    return {"id": response_id, "object": "response", "deleted": True}
