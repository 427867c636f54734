"""The router: an OpenAI-compatible HTTP proxy that sends each session to its worker.

Request lifecycle
  1. The body is read once; the session key comes from ``server.session_key``
     (prompt_cache_key, X-Session-ID, user, else a hash of the prompt's head).
  2. The policy (``routing.policy``) orders the healthy workers for that key.
  3. The request is forwarded on a shared keep-alive ``httpx.AsyncClient``. If
     the worker cannot be reached, or drops the connection before anything was
     sent to the client, the next worker in the order is tried (at most
     ``max_failovers`` more); a refused connection also takes the worker out.
  4. A JSON answer is relayed whole, status and body unchanged (4xx included). A
     stream (``text/event-stream``) is relayed chunk by chunk as it arrives; if the
     worker fails mid-stream, the stream ends with an OpenAI-shaped SSE error event
     and ``data: [DONE]``. Every relayed answer carries ``X-Agentserve-Worker``.
  5. A client disconnect cancels the upstream request (its connection is closed,
     so the worker stops generating). Every wait is bounded by the connect and
     read timeouts.

Endpoints: /v1/* (proxied), /health (ok while >= 1 worker is healthy), /workers
(JSON), /metrics (the router's own), /metrics/worker/{index or id} (a worker's).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import Receive, Scope, Send

from server.config import ConfigError, Settings
from server.errors import AgentServeError, NotFound, UpstreamUnavailable
from server.routing.metrics import RouterMetrics
from server.routing.policy import Outcome, make_policy
from server.routing.workers import Worker, WorkerPool, WorkerSpec, parse_worker_specs
from server.session_key import session_key

log = logging.getLogger("agentserve.routing")

WORKER_HEADER = "x-agentserve-worker"
_HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailers",
    b"transfer-encoding", b"upgrade", b"host", b"content-length",
}


class Router:
    """Workers, policy, metrics and the upstream client of one router process."""

    def __init__(self, settings: Settings, specs: Sequence[WorkerSpec]) -> None:
        self.settings = settings
        rs = settings.routing
        self.pool = WorkerPool(specs, rs)
        self.policy = make_policy(rs)
        self.metrics = RouterMetrics(self.pool)
        self.timeout = httpx.Timeout(
            connect=rs.connect_timeout_s, read=rs.read_timeout_s, write=rs.read_timeout_s,
            pool=rs.connect_timeout_s,
        )
        self.client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self.client = httpx.AsyncClient(
            timeout=self.timeout, trust_env=False,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0),
        )
        await self.pool.start()
        log.info("router: policy %s over %d workers (%d healthy)", self.policy.name,
                 len(self.pool.workers), self.pool.healthy_count())

    async def close(self) -> None:
        await self.pool.close()
        if self.client is not None:
            await self.client.aclose()

    def plan(self, key: str | None) -> tuple[list[Worker], Outcome | None]:
        """Workers to try, in order, for a session key (None: any worker, least loaded first)."""
        workers = self.pool.workers
        if key is None:
            order = sorted((w for w in workers if w.healthy), key=lambda w: w.in_flight)
            outcome = None
        else:
            sel = self.policy.select_worker(key, self.pool.loads())
            order = [workers[i] for i in sel.order] if sel else []
            outcome = sel.outcome if sel else None
        if not order:
            errors = "; ".join(f"{w.id}: {w.last_error or 'not checked yet'}" for w in workers)
            raise UpstreamUnavailable(
                f"no healthy worker: all {len(workers)} workers are out of rotation ({errors}); "
                "check that the workers run and answer GET /health"
            )
        return order[: 1 + self.settings.routing.max_failovers], outcome


class _Retry(Exception):
    """This worker failed before anything reached the client: try the next."""


class ProxyCall(Response):
    """One proxied request, run as the ASGI response (so it sees the client disconnect)."""

    def __init__(self, router: Router, request: Request, body: bytes, key: str | None, t0: float) -> None:
        self.router, self.body_bytes, self.key, self.t0 = router, body, key, t0
        self.method = request.method
        query = request.url.query
        self.path = request.url.path + (f"?{query}" if query else "")
        self.headers_out = [(k, v) for k, v in request.headers.raw if k not in _HOP_BY_HOP]
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:

            async def watch_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()  # closes the upstream connection: the worker stops

            tg.start_soon(watch_disconnect)
            try:
                await self._run(send)
            except OSError:  # the client went away while we were sending
                pass
            tg.cancel_scope.cancel()

    async def _run(self, send: Send) -> None:
        m = self.router.metrics
        try:
            order, outcome = self.router.plan(self.key)
        except UpstreamUnavailable as exc:
            m.upstream_errors.labels("none", "no_worker").inc()
            await _send_json(send, exc.status, exc.body())
            return
        if outcome is not None:
            m.affinity.labels(outcome).inc()
        failures: list[str] = []
        for n, worker in enumerate(order):
            if n and not worker.healthy:
                continue  # taken out while we were trying another
            try:
                await self._attempt(worker, send)
                return
            except _Retry as exc:
                failures.append(f"{worker.id}: {exc}")
                m.failovers.labels(worker.id).inc()
        exc = UpstreamUnavailable(
            "no worker could take the request (" + "; ".join(failures) + "); retry shortly"
        )
        await _send_json(send, exc.status, exc.body())

    async def _attempt(self, worker: Worker, send: Send) -> None:
        router, m = self.router, self.router.metrics
        assert router.client is not None
        worker.in_flight += 1
        status = "error"
        try:
            request = router.client.build_request(
                self.method, worker.url + self.path, headers=self.headers_out, content=self.body_bytes
            )
            t_forward = time.perf_counter()
            try:
                resp = await router.client.send(request, stream=True)
            except httpx.ConnectError as exc:  # includes a refused connection: the worker is gone
                router.pool.mark_down(worker, f"connect failed: {exc}")
                m.upstream_errors.labels(worker.id, "connect").inc()
                raise _Retry(f"cannot connect ({exc})") from None
            except httpx.TimeoutException as exc:
                await self._timeout(worker, send, exc)
                return
            except httpx.TransportError as exc:
                m.upstream_errors.labels(worker.id, "disconnect").inc()
                raise _Retry(f"connection lost before an answer ({type(exc).__name__})") from None
            try:
                status = str(resp.status_code)
                headers = [(k, v) for k, v in resp.headers.raw if k.lower() not in _HOP_BY_HOP]
                headers.append((WORKER_HEADER.encode(), worker.id.encode()))
                if resp.status_code >= 500:
                    m.upstream_errors.labels(worker.id, "status_5xx").inc()
                is_stream = resp.headers.get("content-type", "").startswith("text/event-stream")
                chunks = resp.aiter_raw()
                try:
                    if is_stream:
                        first = await anext(chunks, b"")
                    else:
                        first = b"".join([c async for c in chunks])
                except httpx.TimeoutException as exc:
                    await self._timeout(worker, send, exc)
                    return
                except httpx.TransportError as exc:
                    m.upstream_errors.labels(worker.id, "disconnect").inc()
                    raise _Retry(f"connection lost before an answer ({type(exc).__name__})") from None
                t_answer = time.perf_counter()
                if not is_stream:
                    headers.append((b"content-length", str(len(first)).encode()))
                await send({"type": "http.response.start", "status": resp.status_code, "headers": headers})
                if not is_stream:
                    await send({"type": "http.response.body", "body": first})
                    m.added_latency.observe((t_forward - self.t0) + (time.perf_counter() - t_answer))
                    return
                relay = _EventRelay(send)
                await relay.push(first)
                m.added_latency.observe((t_forward - self.t0) + (time.perf_counter() - t_answer))
                try:
                    async for chunk in chunks:
                        await relay.push(chunk)
                except httpx.TransportError as exc:  # timeouts included
                    m.upstream_errors.labels(worker.id, "midstream").inc()
                    status = "midstream_error"
                    what = "stopped answering" if isinstance(exc, httpx.TimeoutException) else "failed"
                    await relay.fail(UpstreamUnavailable(
                        f"worker {worker.id} {what} mid-stream ({type(exc).__name__}); the answer is "
                        "incomplete: retry the request"
                    ))
                    return
                await relay.finish()
            finally:
                await resp.aclose()
        finally:
            worker.in_flight -= 1
            m.requests.labels(worker.id, status).inc()

    async def _timeout(self, worker: Worker, send: Send, exc: Exception) -> None:
        self.router.metrics.upstream_errors.labels(worker.id, "timeout").inc()
        rs = self.router.settings.routing
        err = UpstreamUnavailable(
            f"worker {worker.id} did not answer in time ({type(exc).__name__}; limits: "
            f"routing.connect_timeout_s={rs.connect_timeout_s}, routing.read_timeout_s={rs.read_timeout_s})",
            code="upstream_timeout",
        )
        await _send_json(send, err.status, err.body())


class _EventRelay:
    """Forwards SSE bytes as they come, holding back only an incomplete trailing event, so
    that an error event can always be appended on a clean event boundary."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.pending = b""

    async def push(self, chunk: bytes) -> None:
        data = self.pending + chunk if self.pending else chunk
        cut = max(data.rfind(b"\n\n") + 2, data.rfind(b"\r\n\r\n") + 4, 0)
        if cut < 2:
            cut = 0
        self.pending = data[cut:]
        if cut:
            await self.send({"type": "http.response.body", "body": data[:cut], "more_body": True})

    async def finish(self) -> None:
        await self.send({"type": "http.response.body", "body": self.pending, "more_body": False})

    async def fail(self, err: AgentServeError) -> None:
        event = b"data: " + json.dumps(err.body()).encode() + b"\n\ndata: [DONE]\n\n"
        await self.send({"type": "http.response.body", "body": event, "more_body": False})


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def _request_key(body: bytes, headers: Any) -> str:
    """The session key, parsing the JSON body only when it can matter."""
    if b'"prompt_cache_key"' not in body and any(k.lower() == "x-session-id" for k in headers):
        return session_key({}, headers).key  # the header wins when the body has no prompt_cache_key
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        parsed = {}  # the worker will answer 400; route it somewhere stable
    return session_key(parsed if isinstance(parsed, dict) else {}, headers).key


def create_router_app(settings: Settings, workers: Sequence[str | WorkerSpec]) -> FastAPI:
    """The router ASGI app over ``workers`` (URLs, ``ID=URL`` strings or WorkerSpecs)."""
    specs = [w if isinstance(w, WorkerSpec) else parse_worker_specs([w])[0] for w in workers]
    if len({s.id for s in specs}) != len(specs):
        raise ConfigError(f"duplicate worker ids: {[s.id for s in specs]}")
    router = Router(settings, specs)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await router.start()
        yield
        await router.close()

    app = FastAPI(title="agentserve router", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.router = router

    @app.exception_handler(AgentServeError)
    async def _error(request: Request, exc: AgentServeError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.get("/health")
    async def health() -> JSONResponse:
        healthy, total = router.pool.healthy_count(), len(router.pool.workers)
        if not healthy:
            raise UpstreamUnavailable(f"no healthy worker (0 of {total})")
        return JSONResponse({"status": "ok", "workers": total, "healthy": healthy})

    @app.get("/workers")
    async def workers_info() -> JSONResponse:
        workers = [w.info() for w in router.pool.workers]
        return JSONResponse({"policy": router.policy.name, "workers": workers})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/metrics/worker/{ref}")
    async def worker_metrics(ref: str) -> Response:
        worker = router.pool.find(ref)
        if worker is None:
            last = len(router.pool.workers) - 1
            raise NotFound(f"no worker {ref!r}: use an index 0..{last} or an id from /workers")
        assert router.client is not None
        try:
            timeout = router.settings.routing.health_timeout_s
            resp = await router.client.get(worker.url + "/metrics", timeout=timeout)
        except httpx.HTTPError as exc:
            err = f"worker {worker.id}: metrics unavailable ({type(exc).__name__})"
            raise UpstreamUnavailable(err) from None
        return Response(resp.content, status_code=resp.status_code,
                        media_type=resp.headers.get("content-type", CONTENT_TYPE_LATEST),
                        headers={WORKER_HEADER: worker.id})

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def proxy(request: Request, path: str) -> Response:
        t0 = time.perf_counter()
        body = await request.body()
        key = _request_key(body, request.headers) if request.method == "POST" else None
        return ProxyCall(router, request, body, key, t0)

    return app


def serve_router(settings: Settings, worker_urls: Sequence[str | WorkerSpec]) -> None:
    """Run the router on settings.host:settings.port until SIGINT/SIGTERM."""
    import uvicorn

    try:
        app = create_router_app(settings, worker_urls)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    uvicorn.run(app, host=settings.host, port=settings.port, access_log=False, log_level="info")
