"""OpenAI routes: chat, completions, models; plus health and metrics."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from server import __version__
from server.admission import Ticket
from server.api.sse import EventStreamResponse, Framing, sse_stream
from server.chat.prepared import Prepared
from server.chat.service import ChatService
from server.dialects.messages.models import anthropic_model, anthropic_model_list
from server.errors import NotFound, Timeout
from server.protocol import ChatCompletionRequest, CompletionRequest

router = APIRouter()
DISCONNECT_POLL_S = 0.25


def _service(request: Request) -> ChatService:
    service: ChatService = request.app.state.service
    return service


async def _await_unless_gone(
    request: Request, work: Awaitable[Any], deadline: float, timeout_s: float
) -> Any:
    """Await ``work``; cancel it if the client disconnects or the deadline passes."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                return None
            if time.monotonic() > deadline:
                raise Timeout(f"request timed out after {timeout_s:g} s (limits.request_timeout_s)")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def admit(
    state: Any, prepare: Callable[[], Prepared], tenant: str = ""
) -> tuple[Prepared, Ticket, float]:
    """Prepare (in a thread) and wait for an admission slot: (prepared, held ticket, deadline).

    ``state`` is the app's state (HTTP routes and the Responses WebSocket share it). The caller
    releases the ticket once the request is served."""
    limits = state.settings.limits
    deadline = time.monotonic() + limits.request_timeout_s
    ticket = state.admission.reserve(tenant)  # a tenant holds its share only (limits.tenant_share)
    try:
        prepared = await asyncio.to_thread(prepare)
        remaining = max(0.0, deadline - time.monotonic())
        try:
            await asyncio.wait_for(ticket.acquire(), remaining)
        except TimeoutError:
            raise Timeout(f"request waited {limits.request_timeout_s:g} s in the queue") from None
    except BaseException:
        ticket.release()
        raise
    return prepared, ticket, deadline


ToJson = Callable[[Prepared, dict[str, Any]], dict[str, Any]]
ToStream = Callable[[Prepared, AsyncIterator[dict[str, Any]]], AsyncIterator[dict[str, Any]]]


async def serve_prepared(
    request: Request,
    prepare: Callable[[], Prepared],
    to_json: ToJson | None = None,
    to_stream: ToStream | None = None,
    framing: Framing | None = None,
) -> Response:
    """The one serving path of every dialect: prepare (thread) → admission → generate → respond.

    A dialect adapter (Responses, Anthropic Messages) passes ``to_json`` to turn the OpenAI
    chat completion into its own body, ``to_stream`` to turn the chat chunks into its own
    events, and ``framing`` for how those events go on the wire (see ``api/sse.py``).
    """
    service = _service(request)
    limits = request.app.state.settings.limits
    prepared, ticket, deadline = await admit(request.app.state, prepare, request.state.tenant)
    if prepared.stream:
        remaining = max(0.001, deadline - time.monotonic())
        chunks = service.stream(prepared)
        if to_stream is not None:
            chunks = to_stream(prepared, chunks)
        return EventStreamResponse(
            sse_stream(chunks, ticket, remaining, framing, limits.stream_keepalive_s or None),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        result = await _await_unless_gone(
            request, service.complete(prepared), deadline, limits.request_timeout_s
        )
    finally:
        ticket.release()
    if result is None:
        return Response(status_code=499)  # the client is gone; nothing to deliver
    # the dialect's object (a stored conversation's echo, a compaction) and its JSON are work in
    # the size of the answer: built and encoded off the event loop
    body = await asyncio.to_thread(
        lambda: json_bytes(to_json(prepared, result) if to_json is not None else result)
    )
    return Response(body, media_type="application/json")


def json_bytes(content: Any) -> bytes:
    """``content`` as Starlette's ``JSONResponse`` renders it (compact, UTF-8, no NaN)."""
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
    return text.encode()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    service = _service(request)
    tenant = request.state.tenant
    raw = await request.json()  # already parsed by FastAPI (cached): the session key uses the body as sent
    return await serve_prepared(request, lambda: service.prepare_chat(body, request.headers, tenant, raw))


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    service = _service(request)
    tenant = request.state.tenant
    raw = await request.json()
    return await serve_prepared(
        request, lambda: service.prepare_completion(body, request.headers, tenant, raw)
    )


def _openai_model(request: Request, name: str) -> dict[str, Any]:
    s = request.app.state.settings
    engine = request.app.state.service.engine
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "agentserve",
        "max_model_len": engine.max_model_len,
        "engine": engine.name,
        "family": request.app.state.service.family.ref,
        # how calls are served: "masked and parsed (envelope X)", or not at all (and why)
        "envelope": request.app.state.service.envelope_ref,
        "tool_calls": request.app.state.service.tool_calls,
        **({"root": s.served_model_name} if name != s.served_model_name else {}),
    }


def _anthropic(request: Request) -> tuple[int, int] | None:
    """(window, most max_tokens) when the request speaks Anthropic's API (``anthropic-version``)."""
    if "anthropic-version" not in request.headers:
        return None
    window = request.app.state.service.engine.max_model_len
    return window, request.app.state.settings.limits.max_tokens or window


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    """One entry per served name (aliases too): the same model, the same context window. Anthropic's
    Models API shape when the request carries ``anthropic-version`` (dialects/messages/models.py)."""
    names = request.app.state.settings.served_model_names()
    anthropic = _anthropic(request)
    if anthropic is not None:
        return anthropic_model_list(names, *anthropic)
    return {"object": "list", "data": [_openai_model(request, name) for name in names]}


@router.get("/v1/models/{name:path}")
async def model(name: str, request: Request) -> dict[str, Any]:
    if name not in request.app.state.settings.served_model_names():
        raise NotFound(f"model {name!r} is not served here: GET /v1/models lists the served names")
    anthropic = _anthropic(request)
    return anthropic_model(name, *anthropic) if anthropic is not None else _openai_model(request, name)


def _engine_problem(request: Request) -> str | None:
    problem: str | None = request.app.state.service.engine.health()
    return problem


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """Readiness (routers, load balancers): 200 while the engine can serve, 503 with the reason
    when it cannot. Load never makes it fail (an overloaded worker answers 429s, not 503s here)."""
    engine = request.app.state.service.engine
    problem = _engine_problem(request)
    if problem is not None:
        body = {"status": "engine_dead", "version": __version__, "engine": engine.name, "reason": problem}
        return JSONResponse(body, 503)
    admission = request.app.state.admission
    unused = engine.retention_hints()
    retention = {"used": unused is None, **({"reason": unused} if unused else {})}
    body = {
        "status": "ok",
        "version": __version__,
        "engine": engine.name,
        "inside": admission.inside,
        "retention_hints": retention,
    }
    return JSONResponse(body)


@router.get("/health/live")
async def live(request: Request) -> JSONResponse:
    """Liveness (restart me?): 503 only when the engine is dead, which a restart fixes; never for load."""
    problem = _engine_problem(request)
    if problem is not None:
        return JSONResponse({"status": "engine_dead", "reason": problem}, 503)
    return JSONResponse({"status": "alive"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    m = request.app.state.metrics
    stats = request.app.state.service.engine.stats()
    for name, value in stats.extra.items():
        m.engine_gauge(name).set(value)
    m.engine_gauge("admission_inside").set(request.app.state.admission.inside)
    m.engine_gauge("admission_rejected").set(request.app.state.admission.rejected)
    return Response(m.render(), media_type="text/plain; version=0.0.4")
