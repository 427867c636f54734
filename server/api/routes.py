"""OpenAI routes: chat, completions, models; plus health and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from server.api.sse import sse_stream
from server.chat.service import ChatService, Prepared, prepare_in_thread
from server.protocol import ChatCompletionRequest, CompletionRequest

router = APIRouter()


def _service(request: Request) -> ChatService:
    return request.app.state.service


async def _respond(service: ChatService, prepared: Prepared) -> Response:
    if prepared.stream:
        return StreamingResponse(
            sse_stream(service.stream(prepared)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return JSONResponse(await service.complete(prepared))


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    service = _service(request)
    prepared = await prepare_in_thread(service.prepare_chat, body, request.headers)
    return await _respond(service, prepared)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    service = _service(request)
    prepared = await prepare_in_thread(service.prepare_completion, body, request.headers)
    return await _respond(service, prepared)


@router.get("/v1/models")
async def models(request: Request) -> dict:
    s = request.app.state.settings
    engine = request.app.state.service.engine
    return {
        "object": "list",
        "data": [
            {
                "id": s.served_model_name,
                "object": "model",
                "created": 0,
                "owned_by": "agentserve",
                "max_model_len": engine.max_model_len,
                "engine": engine.name,
            }
        ],
    }


@router.get("/health")
async def health(request: Request) -> dict:
    return {"status": "ok", "engine": request.app.state.service.engine.name}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    m = request.app.state.metrics
    stats = request.app.state.service.engine.stats()
    for name, value in stats.extra.items():
        m.engine_gauge(name).set(value)
    return Response(m.render(), media_type="text/plain; version=0.0.4")
