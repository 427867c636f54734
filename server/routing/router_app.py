"""The router app: FastAPI for the API surface, the lean ASGI path (``proxy.py``) for /v1/*.

``RouterApp.__call__`` sends /v1/* straight to ``proxy_request``, ahead of FastAPI's middleware
stack (its error, telemetry and body-limit layers cost more per request than the proxy's own
Python did); everything else, lifespan included, is the FastAPI app.

Endpoints: /v1/* (proxied, see proxy.py for the request lifecycle), the /v1/responses WebSocket
(relayed to the session's worker, see websocket.py), /health (ok while >= 1
worker is healthy; always open), /workers (JSON), /metrics (the router's own) and
/metrics/worker/{index or id} (a worker's). With ``auth.protect_metrics`` the last three
need an API key, as a worker's /metrics does.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from server import __version__
from server.auth import authenticate_key, router_headers
from server.browser_guard import host_refusal
from server.config import ConfigError, Settings
from server.errors import AgentServeError, NotFound, UpstreamUnavailable
from server.routing.discovery import DnsDiscovery
from server.routing.forward import REQUEST_PATH, WORKER_HEADER, send_json
from server.routing.proxy import proxy_request
from server.routing.router import Router
from server.routing.upstream import UpstreamError
from server.routing.websocket import PATH as WS_PATH
from server.routing.websocket import serve_websocket
from server.routing.workers import WorkerSpec, parse_worker_specs
from server.ws_gate import uvicorn_ws_options

log = logging.getLogger("agentserve.routing")


class RouterApp(FastAPI):
    """FastAPI, with /v1/* proxied before the middleware stack (see the module header)."""

    lean_router: Router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        wrong_host = None
        if scope["type"] in ("http", "websocket"):  # DNS rebinding (server/browser_guard.py)
            host = Headers(scope=scope).get("host")
            wrong_host = host_refusal(scope["path"], host, self.lean_router.settings)
        if wrong_host is not None and scope["type"] == "http":
            REQUEST_PATH.set(scope["path"])
            await send_json(send, wrong_host.status, wrong_host.body())
        elif scope["type"] == "websocket" and scope["path"] == WS_PATH:
            try:
                await serve_websocket(self.lean_router, scope, receive, send, wrong_host)
            except Exception:  # a bug: the client's socket ends with 1011 (internal error)
                log.exception("router: unexpected error on the %s WebSocket", WS_PATH)
                try:
                    await send({"type": "websocket.close", "code": 1011})
                except Exception:
                    log.debug("router: could not close the WebSocket", exc_info=True)
        elif scope["type"] == "http" and scope["path"].startswith("/v1/"):
            try:
                await proxy_request(self.lean_router, scope, receive, send)
            except Exception:  # a bug: still an OpenAI-shaped answer (FastAPI's error layer is skipped)
                log.exception("router: unexpected error on %s %s", scope["method"], scope["path"])
                error = AgentServeError("internal router error (logged on the router); please report it")
                try:
                    await send_json(send, error.status, error.body())
                except Exception:  # the response had begun: the client sees it end early
                    log.debug("router: could not send the error answer", exc_info=True)
        else:
            await super().__call__(scope, receive, send)


def create_router_app(
    settings: Settings, workers: Sequence[str | WorkerSpec], discovery: DnsDiscovery | None = None
) -> FastAPI:
    """The router ASGI app over ``workers`` (URLs, ``ID=URL`` strings or WorkerSpecs) and/or the
    workers a DNS name resolves to."""
    specs = [w if isinstance(w, WorkerSpec) else parse_worker_specs([w])[0] for w in workers]
    if len({s.id for s in specs}) != len(specs):
        raise ConfigError(f"duplicate worker ids: {[s.id for s in specs]}")
    router = Router(settings, specs, discovery)
    auth = settings.auth

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await router.start()
        yield
        await router.close()

    app = RouterApp(
        title="agentserve router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.router = app.lean_router = router

    def guard(request: Request) -> None:
        if auth.protect_metrics:
            authenticate_key(request.headers, auth)

    @app.exception_handler(AgentServeError)
    async def _error(request: Request, exc: AgentServeError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.get("/health")
    async def health() -> JSONResponse:
        healthy, total = router.pool.healthy_count(), len(router.pool.workers)
        if not healthy:
            raise UpstreamUnavailable(f"no healthy worker (0 of {total})")
        return JSONResponse({"status": "ok", "version": __version__, "workers": total, "healthy": healthy})

    @app.get("/workers")
    async def workers_info(request: Request) -> JSONResponse:
        guard(request)
        workers = [w.info() for w in router.pool.workers]
        return JSONResponse({"policy": router.policy.name, "workers": workers})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        guard(request)
        return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/metrics/worker/{ref}")
    async def worker_metrics(ref: str, request: Request) -> Response:
        guard(request)
        tenant = authenticate_key(request.headers, auth) if auth.protect_metrics else ""
        worker = router.pool.find(ref)
        if worker is None:
            last = len(router.pool.workers) - 1
            raise NotFound(f"no worker {ref!r}: use an index 0..{last} or an id from /workers")
        headers = (
            [(b"authorization", request.headers["authorization"].encode())]
            if "authorization" in request.headers
            else []
        )
        try:
            resp = await router.upstream.send(
                worker.url, "GET", "/metrics", headers + router_headers(tenant, auth), b""
            )
            try:
                content = b"".join([c async for c in resp.chunks()])
            finally:
                await resp.aclose()
        except UpstreamError as exc:
            raise UpstreamUnavailable(f"worker {worker.id}: metrics unavailable ({exc})") from None
        media = next((v.decode() for k, v in resp.headers if k == b"content-type"), CONTENT_TYPE_LATEST)
        return Response(
            content, status_code=resp.status, media_type=media, headers={WORKER_HEADER: worker.id}
        )

    return app


def serve_router(
    settings: Settings,
    worker_urls: Sequence[str | WorkerSpec],
    workers_dns: str | None = None,
) -> None:
    """Run the router on settings.host:settings.port until SIGINT/SIGTERM."""
    import uvicorn

    try:
        discovery = DnsDiscovery.parse(workers_dns, settings.routing.dns_interval_s) if workers_dns else None
        app = create_router_app(settings, worker_urls, discovery)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        access_log=False,
        log_level="info",
        proxy_headers=False,
        limit_concurrency=settings.limits.max_connections,
        **uvicorn_ws_options(settings),  # frame cap, no per-message deflate (ws_gate.py)
        server_header=False,
        date_header=False,
    )
