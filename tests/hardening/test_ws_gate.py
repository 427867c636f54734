"""WebSockets inside the worker's limits (issue 37 item 3, issue 36 item 5): sockets counted and
refused past websocket.max_sockets so HTTP and /health/live stay up, the Origin check, the 101's
x-codex-websocket-max-message-bytes, an oversized message answered (not a dropped socket),
per-message deflate off. A real uvicorn server (upgrades are uvicorn's), a scripted engine."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as connect_sync

from server.app import build_app
from server.config import AuthSettings, Settings, WebSocketSettings
from server.ws_gate import MAX_MESSAGE_HEADER, uvicorn_ws_options
from tests.conftest import running_server, worker_settings
from tests.hardening.slow_engine import SlowEngine

MODEL = "smollm2-135m-instruct"


def settings_with(limits: dict[str, Any] | None = None, **websocket: Any) -> Settings:
    s = worker_settings()
    update: dict[str, Any] = {"websocket": WebSocketSettings(**websocket)}
    if limits:
        update["limits"] = s.limits.model_copy(update=limits)
    return s.model_copy(update=update)


def serve(settings: Settings, tokenizer: Any) -> Any:
    """The worker app under uvicorn with the options ``serve_worker`` uses."""
    app = build_app(settings, engine=SlowEngine(tokenizer))
    options = uvicorn_ws_options(settings)
    return running_server(app, limit_concurrency=settings.limits.max_connections, **options)


def warm_up(text: str = "Hi.") -> str:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return json.dumps({"type": "response.create", "model": MODEL, "input": [item], "generate": False})


async def open_sockets(url: str, n: int, batch: int = 100) -> tuple[list[ClientConnection], list[Any]]:
    """Open ``n`` idle sockets (``batch`` handshakes at a time): (opened, refused responses)."""
    opened: list[ClientConnection] = []
    refused: list[Any] = []

    async def one() -> None:
        try:
            opened.append(await connect(url, open_timeout=60, ping_interval=None, compression=None))
        except InvalidStatus as exc:
            refused.append(exc.response)

    for start in range(0, n, batch):
        await asyncio.gather(*(one() for _ in range(min(batch, n - start))))
    return opened, refused


async def flood(url: str, n: int) -> dict[str, Any]:
    ws_url = url.replace("http://", "ws://") + "/v1/responses"
    opened, refused = await open_sockets(ws_url, n)
    try:
        live = await asyncio.to_thread(httpx.get, url + "/health/live", timeout=30)
        chat = await asyncio.to_thread(
            httpx.post,
            url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
            timeout=30,
        )
        await opened.pop().close()
        await asyncio.sleep(0.2)  # the server sees the close
        again, _ = await open_sockets(ws_url, 1)
        opened += again
        return {"opened": len(opened), "refused": refused, "live": live.status_code, "chat": chat.status_code}
    finally:
        await asyncio.gather(*(ws.close() for ws in opened), return_exceptions=True)


def test_sockets_past_the_limit_are_refused_and_http_stays_up(tokenizer):
    settings = settings_with(limits={"max_connections": 24})  # max_sockets: half, 12
    with serve(settings, tokenizer) as url:
        got = asyncio.run(flood(url, 30))
    assert got["opened"] == 12 and len(got["refused"]) == 18, got  # one closed, one more taken
    assert got["live"] == 200 and got["chat"] == 200, got
    first = got["refused"][0]
    assert first.status_code == 503 and first.headers["Retry-After"] == "1"
    assert json.loads(first.body)["error"]["code"] == "too_many_websockets"


@pytest.mark.slow
def test_2100_idle_sockets_against_2048_connections_leave_health_live_up(tokenizer):
    settings = worker_settings()  # limits.max_connections 2,048 → 1,024 sockets
    with serve(settings, tokenizer) as url:
        got = asyncio.run(flood(url, 2100))
    assert got["opened"] == 1024 and len(got["refused"]) == 2100 - 1024, got["opened"]
    assert got["live"] == 200 and got["chat"] == 200, got


def test_the_101_names_the_message_limit_and_an_oversized_message_is_answered(tokenizer):
    settings = settings_with(limits={"max_request_bytes": 4096})
    with serve(settings, tokenizer) as url:
        with connect_sync(url.replace("http://", "ws://") + "/v1/responses") as ws:  # offers deflate
            headers = ws.response.headers
            assert headers[MAX_MESSAGE_HEADER] == "4096"
            assert "sec-websocket-extensions" not in headers  # per-message deflate off
            ws.send(warm_up("x" * 5000))  # over the app's limit, under the transport's cap
            error = json.loads(ws.recv(timeout=30))
            assert error["type"] == "error" and error["status"] == 413, error
            assert MAX_MESSAGE_HEADER in error["error"]["message"]
            ws.send(warm_up())  # the socket lives on
            events = [json.loads(ws.recv(timeout=30)) for _ in range(3)]
            assert events[-1]["type"] == "response.completed"


def test_serve_worker_and_the_router_run_uvicorn_with_the_websocket_options(monkeypatch):
    import uvicorn

    from server.app import serve_worker
    from server.routing.router_app import serve_router

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    settings = worker_settings()
    serve_worker(settings)
    serve_router(settings, ["http://127.0.0.1:9"])
    for kw in calls:
        assert kw["ws_per_message_deflate"] is False
        assert kw["ws_max_size"] == 2 * settings.limits.max_request_bytes


@pytest.mark.parametrize(
    ("keys", "allowed", "origin", "ok"),
    [
        ({}, [], None, True),  # Codex, SDKs: no Origin
        ({}, [], "http://evil.example", False),  # keyless: no browser page drives the model
        ({}, ["http://localhost:3000"], "http://localhost:3000", True),
        ({}, ["http://localhost:3000"], "http://evil.example", False),
        ({}, ["*"], "http://evil.example", True),
        ({"t": "sk-good"}, [], "http://evil.example", True),  # keyed: the key decides
        ({"t": "sk-good"}, ["http://localhost:3000"], "http://evil.example", False),
    ],
)
def test_the_origin_check(tokenizer, keys, allowed, origin, ok):
    s = settings_with(allowed_origins=allowed)
    s = s.model_copy(update={"auth": AuthSettings(api_keys=keys)})
    headers = {"Authorization": "Bearer sk-good"} if keys else {}
    if origin is not None:
        headers["origin"] = origin
    with TestClient(build_app(s, engine=SlowEngine(tokenizer))) as c:
        if ok:
            with c.websocket_connect("/v1/responses", headers=headers) as ws:
                ws.send_text(warm_up())
                assert json.loads(ws.receive_text())["type"] == "response.created"
        else:
            with pytest.raises(WebSocketDenialResponse) as denied:
                with c.websocket_connect("/v1/responses", headers=headers):
                    pass
            assert denied.value.status_code == 403
            assert denied.value.json()["error"]["code"] == "origin_not_allowed"
            assert "websocket.allowed_origins" in denied.value.json()["error"]["message"]


@contextmanager
def stalled_turn(tokenizer: Any, limits: dict[str, Any]) -> Iterator[tuple[Any, SlowEngine, float]]:
    """A turn of ~1.1 KB events to a client that never reads (a 4 KiB receive buffer), on a real
    uvicorn server: yields (app, engine, when the turn was sent)."""
    settings = settings_with(limits=limits)
    engine = SlowEngine(tokenizer, step_s=0.0, burst=256)  # ~1.1 KB per event
    engine.max_model_len = 4_000_000
    app = build_app(settings, engine=engine)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]}
    body = {"type": "response.create", "model": MODEL, "input": [item], "max_output_tokens": 3_900_000}
    with running_server(app, **uvicorn_ws_options(settings)) as url:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        ws = connect_sync(url.replace("http://", "ws://") + "/v1/responses", max_queue=1, sock=sock)
        try:
            ws.send(json.dumps(body))
            yield app, engine, time.monotonic()
        finally:
            ws.close_socket()


def test_a_client_that_stops_reading_frees_its_slot(tokenizer):
    """A client that never reads holds its engine request and admission slot at most until the
    request's deadline (+ 1 s where a send is still blocked then: the socket is ended,
    server/api/responses_ws.py). A regression check: on this box the stream's own deadline usually
    ends it first (a blocked send is the next test's)."""
    with stalled_turn(tokenizer, {"request_timeout_s": 3.0}) as (app, engine, sent):
        run = engine.wait_closed(0, timeout_s=30)
        assert not run.finished and run.closed_at is not None and run.closed_at - sent < 3.0 + 2.5
        deadline = time.monotonic() + 5
        while app.state.admission.inside:  # the slot is free
            assert time.monotonic() < deadline
            time.sleep(0.02)


def test_a_socket_write_blocked_past_the_send_timeout_ends_the_turn(tokenizer):
    """limits.stream_send_timeout_s bounds one WebSocket write as it bounds one SSE write: a client
    that stops reading loses its turn within seconds, not at the request's deadline (60 s here)."""
    limits = {"request_timeout_s": 60.0, "stream_send_timeout_s": 1.0}
    with stalled_turn(tokenizer, limits) as (_, engine, sent):
        run = engine.wait_closed(0, timeout_s=45)
        assert not run.finished and run.closed_at is not None and run.closed_at - sent < 20.0


def test_a_refused_upgrade_logs_no_incomplete_handshake_error(tokenizer):
    """uvicorn's websockets-sansio protocol logged ERROR "ASGI callable returned without completing
    handshake." for every denial it had sent correctly (Kludex/uvicorn#3138): one per refused socket."""
    seen: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = seen.append  # type: ignore[method-assign]
    uvicorn_log = logging.getLogger("uvicorn.error")
    try:
        with serve(settings_with(), tokenizer) as url:
            uvicorn_log.addHandler(handler)  # after uvicorn's dictConfig, which drops its handlers
            ws_url = url.replace("http://", "ws://") + "/v1/responses"

            async def refused() -> int:
                try:
                    await connect(
                        ws_url, additional_headers={"Origin": "http://evil.example"}, open_timeout=30
                    )
                except InvalidStatus as exc:
                    return exc.response.status_code
                return 101

            for _ in range(3):
                assert asyncio.run(refused()) == 403
            time.sleep(0.5)  # uvicorn logs after the app returns
    finally:
        uvicorn_log.removeHandler(handler)
    errors = [r.getMessage() for r in seen if r.levelno >= logging.ERROR]
    assert not errors, errors
