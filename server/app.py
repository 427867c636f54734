"""The worker app: one engine, one chat service, the OpenAI routes, errors mapped once."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from server.admission import Admission
from server.api.codex_catalog import router as codex_catalog_router
from server.api.messages import router as messages_router
from server.api.responses import router as responses_router
from server.api.responses_compact import router as responses_compact_router
from server.api.responses_ws import router as responses_ws_router
from server.api.routes import router
from server.api.tokenize import router as tokenize_router
from server.auth import check_worker_auth
from server.body_limit import BodyLimit
from server.chat.service import ChatService
from server.config import ConfigError, Settings
from server.constrain.compile_cache import set_compile_timeout
from server.constrain.row_cache import ROWS
from server.dialects.messages.error_shape import shape_error
from server.engines.base import Engine
from server.errors import AgentServeError, internal_error_body
from server.families.model_facts import load_model_facts
from server.front_door import FrontDoor, route_paths
from server.heap import release_free_heap
from server.metrics import Metrics
from server.ws_gate import uvicorn_ws_options

log = logging.getLogger(__name__)


def check_settings(settings: Settings) -> None:
    """What the config schema cannot know: names that must exist in a registry, an auth setup
    that would serve someone unauthenticated (ConfigError)."""
    from server.constrain.arguments.backends import backend_names

    check_worker_auth(settings.auth)
    if settings.grammar_backend not in backend_names():
        raise ConfigError(
            f"grammar_backend {settings.grammar_backend!r} is not available: use one of {backend_names()} "
            f"(a backend whose package is not installed is not registered)"
        )


def engine_kind(settings: Settings) -> str:
    """The configured engine; left unset, a .gguf model goes to llamacpp when llama_cpp is installed."""
    if "engine" in settings.model_fields_set or not settings.model.endswith(".gguf"):
        return settings.engine
    return "llamacpp" if importlib.util.find_spec("llama_cpp") is not None else settings.engine


def build_engine(settings: Settings) -> Engine:
    """The model's facts first (tokenizer, family, end-of-reply ids: ``load_model_facts``), then
    the configured engine, given them."""
    kind = engine_kind(settings)
    facts = load_model_facts(settings, kind)
    if kind == "llamacpp":
        from server.engines.llamacpp.engine import LlamaCppEngine  # imports llama_cpp: only for this engine

        return LlamaCppEngine(settings.engine_settings(), facts)
    if kind == "vllm":
        from server.engines.vllm.engine import VllmEngine  # imports vllm (lazily): only for this engine

        return VllmEngine(settings.engine_settings(), facts)
    from server.engines.hf.engine import HFEngine

    return HFEngine(settings.engine_settings(), facts)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request body", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON: send a JSON object with 'model' and 'messages'", None
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value")
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return f"invalid request: {param or 'body'}: {msg}{more}", param


def build_app(settings: Settings, engine: Engine | None = None) -> FastAPI:
    check_settings(settings)
    set_compile_timeout(settings.limits.grammar_compile_timeout_s)
    ROWS.set_budget(settings.limits.mask_cache_mb * 2**20)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        eng = engine if engine is not None else build_engine(settings)
        await eng.start()
        app.state.service = ChatService(eng, settings, metrics)
        release_free_heap()  # what loading the tokenizer and the weights freed (heap.py)
        try:
            yield
        finally:
            if engine is None:  # an engine passed in belongs to the caller
                await eng.shutdown()

    # the API docs describe every path to whoever asks: with keys (or behind a router) they are off
    keyed = bool(settings.auth.api_keys) or settings.auth.require_router
    docs: dict[str, Any] = {"docs_url": None, "redoc_url": None, "openapi_url": None} if keyed else {}
    app = FastAPI(title="agentserve", version="0.1.0", lifespan=lifespan, **docs)
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.admission = Admission(
        settings.limits.max_concurrent_requests, settings.limits.max_queued_requests, settings.tenant_share()
    )
    app.include_router(router)
    app.include_router(tokenize_router)
    app.include_router(messages_router)
    app.include_router(responses_router)
    app.include_router(responses_ws_router)
    app.include_router(codex_catalog_router)
    app.include_router(responses_compact_router)
    max_body = settings.limits.max_request_bytes
    app.add_middleware(BodyLimit, max_bytes=max_body, timeout_s=settings.limits.body_timeout_s)

    # outermost: auth and the Content-Length check run before BodyLimit reads a body (front_door.py)
    app.add_middleware(
        FrontDoor,
        settings=settings,
        metrics=metrics,
        paths=lambda: route_paths(app.routes),
    )

    @app.exception_handler(AgentServeError)
    async def on_agentserve_error(request: Request, exc: AgentServeError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)} if hasattr(exc, "retry_after_s") else None
        body = shape_error(request.url.path, exc.status, exc.body(), exc)
        return JSONResponse(body, status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
        return JSONResponse(shape_error(request.url.path, 400, body), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        body = {"error": {"message": str(exc.detail), "type": kind, "param": None, "code": None}}
        return JSONResponse(shape_error(request.url.path, exc.status_code, body), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(shape_error(request.url.path, 500, internal_error_body(exc)), status_code=500)

    return app


def serve_worker(settings: Settings) -> None:
    import uvicorn

    app = build_app(settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        timeout_graceful_shutdown=30,
        limit_concurrency=settings.limits.max_connections,
        **uvicorn_ws_options(settings),  # frame cap, no per-message deflate (ws_gate.py)
    )
