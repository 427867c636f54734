"""Per-socket bounds of the Responses WebSocket (issue 37 item 4): the conversation a socket holds
is bounded in bytes, store: false stays off the store, warm-ups (generate: false) take an
admission ticket. The real app over starlette's test client, a scripted engine."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import build_app
from server.config import WebSocketSettings
from tests.conftest import worker_settings
from tests.hardening.slow_engine import SlowEngine

MODEL = "smollm2-135m-instruct"
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


def create(text: str, **kw: Any) -> str:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    body = {"model": MODEL, "input": [item], "prompt_cache_key": "ws-limits", "max_output_tokens": 2}
    return json.dumps({"type": "response.create", **body, **kw})


def last(ws: Any) -> dict[str, Any]:
    for _ in range(5000):
        event: dict[str, Any] = json.loads(ws.receive_text())
        if event["type"] in TERMINAL:
            return event
    raise AssertionError("no terminal event")


def app_with(tokenizer: Any, **changes: Any) -> tuple[Any, SlowEngine]:
    settings = worker_settings()
    limits = changes.pop("limits", {})
    settings = settings.model_copy(
        update={
            "limits": settings.limits.model_copy(update=limits),
            "websocket": WebSocketSettings(**changes),
        }
    )
    engine = SlowEngine(tokenizer, step_s=0.01)
    return build_app(settings, engine=engine), engine


def test_the_held_conversation_is_bounded_in_bytes(tokenizer):
    app, _ = app_with(tokenizer, max_conversation_bytes=4096)
    words = "lorem ipsum " * 100  # ~1.2 KB per turn
    with TestClient(app) as c, c.websocket_connect("/v1/responses") as ws:
        prev = None
        for _ in range(3):  # 3 x 1.2 KB: held
            ws.send_text(create(words, generate=False, previous_response_id=prev, store=False))
            done = last(ws)
            assert done["type"] == "response.completed", done
            prev = done["response"]["id"]
        ws.send_text(create(words, generate=False, previous_response_id=prev, store=False))
        error = last(ws)
        assert error["type"] == "error" and error["status"] == 400, error
        assert error["error"]["code"] == "conversation_too_large"
        assert "websocket.max_conversation_bytes" in error["error"]["message"]
        ws.send_text(create("A fresh start."))  # the socket lives on
        assert last(ws)["type"] == "response.incomplete"


def test_store_false_is_held_by_the_socket_only(tokenizer):
    app, _ = app_with(tokenizer)
    with TestClient(app) as c:
        with c.websocket_connect("/v1/responses") as ws:
            ws.send_text(create("Hi.", store=False))
            private = last(ws)["response"]["id"]
            ws.send_text(create("Again.", previous_response_id=private, store=True))
            kept = last(ws)["response"]["id"]
        # stored before its terminal event went out: found at once (the socket closed on seeing it)
        assert c.get(f"/v1/responses/{kept}").status_code == 200
        assert c.get(f"/v1/responses/{private}").status_code == 404


def test_a_warm_up_takes_an_admission_ticket(tokenizer):
    app, engine = app_with(tokenizer, limits={"max_concurrent_requests": 1, "max_queued_requests": 0})
    engine.step_s = 0.05
    with TestClient(app) as c:
        with c.websocket_connect("/v1/responses") as busy, c.websocket_connect("/v1/responses") as warm:
            busy.send_text(create("Write a long story.", max_output_tokens=400))
            assert json.loads(busy.receive_text())["type"] == "response.created"  # it holds the one slot
            warm.send_text(create("Read a.py.", generate=False))
            refused = last(warm)
            assert refused["type"] == "error" and refused["status"] == 429, refused
            assert refused["error"]["type"] == "rate_limit_error"
            busy.send_text(json.dumps({"type": "response.interrupt", "response_id": None}))
            assert last(busy)["type"] == "response.incomplete"
            warm.send_text(create("Read a.py.", generate=False))  # the slot is free again
            assert last(warm)["type"] == "response.completed"


@pytest.mark.slow
def test_a_warm_up_flood_stays_inside_the_queue(tokenizer):
    """16 sockets x 4 warm-ups at once against 2 running + 4 queued: the rest are 429s, none hangs."""
    app, engine = app_with(tokenizer, limits={"max_concurrent_requests": 2, "max_queued_requests": 4})
    engine.max_model_len = 400_000  # the big warm-ups fit the window: only admission refuses them
    answers: list[str] = []
    lock = threading.Lock()
    big = "x " * 200_000  # ~400 KB of input: a prepare that takes a while

    with TestClient(app) as c:

        def flood() -> None:
            with c.websocket_connect("/v1/responses") as ws:
                for _ in range(4):
                    ws.send_text(create(big, generate=False, store=False))
                for _ in range(4):
                    kind = last(ws)
                    with lock:
                        answers.append(str(kind.get("status", kind["type"])))

        threads = [threading.Thread(target=flood) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert len(answers) == 64 and set(answers) == {"response.completed", "429"}, answers
