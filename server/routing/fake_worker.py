"""A simulated worker for router tests and benchmarks: the worker's HTTP API, no model.

It answers /v1/chat/completions (JSON or SSE), /v1/completions, /v1/models, /health
and /metrics like a real worker (and /v1/responses, /v1/messages[/count_tokens] with the chat
shapes, for routing tests; the ``/v1/responses`` WebSocket answers each ``response.create`` with
``response.created`` + ``response.completed`` naming the worker, continues only from the socket's
latest response id, and closes after ``ws_close_after`` responses when that is set), and adds
controls under /fake/: ``POST /fake/config``
(delays, chunk count, die after k chunks, report unhealthy), ``GET /fake/log`` (which
session each request had, whether it completed or was cancelled), ``POST /fake/reset``.

Simulated prefix cache (clearly not a model): the prompt is split into whitespace
"tokens", cut into blocks of ``block_size``, and blocks are keyed by a chained hash as
in the real engine; ``cached_tokens`` = the leading blocks already seen on this worker
(LRU, ``cache_blocks`` capacity). Prefill costs ``prefill_s_per_token`` per uncached
token, one request at a time (one engine per worker), which gives a simulated TTFT.

Run: ``python -m server.routing.fake_worker --port 8101 --id w1`` (or ``--fd N``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from server.session_key import session_key


class FakeEngine:
    def __init__(
        self,
        worker_id: str,
        block_size: int = 16,
        cache_blocks: int = 100_000,
        prefill_s_per_token: float = 0.0,
    ) -> None:
        self.worker_id = worker_id
        self.block_size = block_size
        self.cache_blocks = cache_blocks
        self.config: dict[str, Any] = {
            "delay_s": 0.0,
            "chunks": 3,
            "chunk_delay_s": 0.0,
            "die_after_chunks": None,
            "healthy": True,
            "prefill_s_per_token": prefill_s_per_token,
            "ws_close_after": None,
        }
        self.cache: OrderedDict[bytes, None] = OrderedDict()
        self.log: list[dict[str, Any]] = []
        self.lock = asyncio.Lock()

    def prefix_lookup(self, text: str) -> tuple[int, int]:
        """(prompt tokens, cached tokens) for this prompt; caches its full blocks."""
        tokens = text.split()
        bs, h, cached, hit = self.block_size, b"", 0, True
        for start in range(0, len(tokens) - bs + 1, bs):
            h = hashlib.sha256(h + "\x1f".join(tokens[start : start + bs]).encode()).digest()
            if hit and h in self.cache:
                cached += bs
                self.cache.move_to_end(h)
            else:
                hit = False
                self.cache[h] = None
                if len(self.cache) > self.cache_blocks:
                    self.cache.popitem(last=False)
        return len(tokens), cached


def _prompt_text(body: dict[str, Any]) -> str:
    if "input" in body and "messages" not in body:  # Responses
        return json.dumps(body["input"]) if not isinstance(body["input"], str) else body["input"]
    if "messages" in body:
        parts = []
        for m in body["messages"]:
            content = m.get("content")
            parts.append(f"<{m.get('role')}> {content if isinstance(content, str) else json.dumps(content)}")
        return " ".join(parts)
    return str(body.get("prompt", ""))


def create_fake_worker(worker_id: str, **engine_kw: Any) -> FastAPI:
    app = FastAPI(title=f"fake worker {worker_id}")
    eng = FakeEngine(worker_id, **engine_kw)
    app.state.engine = eng

    @app.get("/health")
    async def health() -> JSONResponse:
        if not eng.config["healthy"]:
            return JSONResponse({"status": "unhealthy"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(f'fake_worker_requests_total{{worker="{worker_id}"}} {len(eng.log)}\n')

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        model = {"id": "fake", "object": "model", "owned_by": worker_id}
        return JSONResponse({"object": "list", "data": [model]})

    @app.post("/fake/config")
    async def configure(request: Request) -> JSONResponse:
        eng.config.update(await request.json())
        return JSONResponse(eng.config)

    @app.get("/fake/log")
    async def get_log() -> JSONResponse:
        return JSONResponse(eng.log)

    @app.post("/fake/reset")
    async def reset() -> JSONResponse:
        eng.log.clear()
        eng.cache.clear()
        return JSONResponse({"ok": True})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(request, chat=False)

    @app.get("/v1/responses/{response_id}")
    @app.delete("/v1/responses/{response_id}")
    async def stored_response(response_id: str, request: Request) -> JSONResponse:
        eng.log.append({"path": request.url.path, "method": request.method, "session": None})
        return JSONResponse({"id": response_id, "object": "response", "worker": worker_id})

    @app.post("/v1/responses")
    @app.post("/v1/messages")
    @app.post("/v1/messages/count_tokens")
    async def other_dialects(request: Request) -> Response:  # routing only: the chat shapes stand in
        return await _complete(request, chat=True)

    @app.websocket("/v1/responses")
    async def responses_socket(ws: WebSocket) -> None:
        await ws.accept()
        latest, answered = None, 0
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            body = json.loads(message.get("text") or "{}")
            eng.log.append(
                {
                    "session": session_key(body, ws.headers).key,
                    "path": "/v1/responses",
                    "websocket": True,
                    "previous_response_id": body.get("previous_response_id"),
                    "tenant": ws.headers.get("x-agentserve-tenant"),
                    "router_token": ws.headers.get("x-agentserve-router-token"),
                }
            )
            prev = body.get("previous_response_id")
            if prev is not None and prev != latest:
                err = {"message": f"no response {prev!r}", "type": "invalid_request_error"}
                error = {**err, "code": "previous_response_not_found", "param": "previous_response_id"}
                await ws.send_text(json.dumps({"type": "error", "status": 400, "error": error}))
                continue
            answered += 1
            latest = f"resp_{worker_id}_{answered}"
            response = {"id": latest, "object": "response", "status": "completed", "output_text": worker_id}
            await ws.send_text(json.dumps({"type": "response.created", "response": response}))
            await ws.send_text(json.dumps({"type": "response.completed", "response": response}))
            if eng.config["ws_close_after"] is not None and answered >= eng.config["ws_close_after"]:
                await ws.close(code=1001)
                return

    async def _complete(request: Request, chat: bool) -> Response:
        t0 = time.perf_counter()
        body = await request.json()
        if body.get("model") == "missing":
            err = {
                "message": "model 'missing' does not exist",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
            return JSONResponse({"error": err}, status_code=404)
        cfg = dict(eng.config)
        record: dict[str, Any] = {
            "session": session_key(body, request.headers).key,
            "path": request.url.path,
            "query": request.url.query,
            "source": session_key(body, request.headers).source,
            "stream": bool(body.get("stream")),
            "completed": False,
            "cancelled": False,
            "chunks_sent": 0,
            "tenant": request.headers.get("x-agentserve-tenant"),
            "router_token": request.headers.get("x-agentserve-router-token"),
            "peer": request.client.port if request.client else None,  # which upstream connection
        }
        eng.log.append(record)
        deadline = time.perf_counter() + cfg["delay_s"]
        while time.perf_counter() < deadline:  # like a real worker: give up when the client leaves
            if await request.is_disconnected():
                record["cancelled"] = True
                return JSONResponse({"error": "client gone"}, status_code=499)
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.perf_counter())))
        async with eng.lock:  # one engine: prefills queue up
            prompt_tokens, cached = eng.prefix_lookup(_prompt_text(body))
            if cfg["prefill_s_per_token"]:
                await asyncio.sleep(cfg["prefill_s_per_token"] * (prompt_tokens - cached))
        record.update(prompt_tokens=prompt_tokens, cached_tokens=cached, ttft_s=time.perf_counter() - t0)
        n = int(body.get("max_tokens") or cfg["chunks"]) if not body.get("stream") else int(cfg["chunks"])
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        cache = {
            "cached_tokens": cached,
            "prompt_tokens": prompt_tokens,
            "diverged_at_token": None,
            "reason": None,
        }
        base = {
            "id": f"cmpl-{worker_id}-{len(eng.log)}",
            "created": int(time.time()),
            "model": "fake",
            "system_fingerprint": worker_id,
        }
        if not body.get("stream"):
            record["completed"] = True
            text = " ".join(f"tok{i}" for i in range(n))
            if chat:
                message = {"role": "assistant", "content": text}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": text, "finish_reason": "stop"}
                obj = "text_completion"
            return JSONResponse({**base, "object": obj, "choices": [choice], "usage": usage, "cache": cache})

        async def events() -> AsyncIterator[str]:
            try:
                for i in range(n):
                    if i and cfg["chunk_delay_s"]:
                        await asyncio.sleep(cfg["chunk_delay_s"])
                    if cfg["die_after_chunks"] is not None and i >= cfg["die_after_chunks"]:
                        os.kill(os.getpid(), signal.SIGKILL)
                    delta = {"content": f"tok{i} "} if chat else None
                    choice = (
                        {"index": 0, "delta": delta, "finish_reason": None}
                        if chat
                        else {"index": 0, "text": f"tok{i} ", "finish_reason": None}
                    )
                    chunk = {**base, "object": "chat.completion.chunk", "choices": [choice]}
                    yield f"data: {json.dumps(chunk)}\n\n"
                    record["chunks_sent"] = i + 1
                last = {
                    **base,
                    "object": "chat.completion.chunk",
                    "choices": [],
                    "usage": usage,
                    "cache": cache,
                }
                yield f"data: {json.dumps(last)}\n\n"
                yield "data: [DONE]\n\n"
                record["completed"] = True
            finally:
                record["cancelled"] = not record["completed"]

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--id", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--fd", type=int, help="serve on an inherited listening socket")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--cache-blocks", type=int, default=100_000)
    p.add_argument("--prefill-s-per-token", type=float, default=0.0)
    a = p.parse_args()
    app = create_fake_worker(
        a.id, block_size=a.block_size, cache_blocks=a.cache_blocks, prefill_s_per_token=a.prefill_s_per_token
    )
    if a.fd is None:
        uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning", access_log=False)
        return
    # not uvicorn's fd=: it wraps the fd as AF_UNIX, so TCP_NODELAY is never set on the
    # connections and Nagle + delayed ACKs add 40 ms to every response
    sock = socket.socket(fileno=a.fd)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


if __name__ == "__main__":
    main()
