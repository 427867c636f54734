"""``response.interrupt`` on the Responses WebSocket (Codex 0.169 / 0.171 send it on Esc), and a
client that leaves mid-stream: the real app over starlette's test client, a slow scripted engine."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import build_app
from tests.conftest import worker_settings
from tests.hardening.slow_engine import SlowEngine

MODEL = "smollm2-135m-instruct"
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


def create(key: str, text: str, **kw: Any) -> str:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    body = {"model": MODEL, "input": [item], "prompt_cache_key": key, "store": False}
    body["max_output_tokens"] = 500
    return json.dumps({"type": "response.create", **body, **kw})


def until(ws: Any, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for _ in range(5000):
        events.append(json.loads(ws.receive_text()))
        if events[-1]["type"] in kinds:
            return events
    raise AssertionError(f"none of {kinds} in {len(events)} events")


@pytest.fixture
def engine(tokenizer):
    return SlowEngine(tokenizer, step_s=0.02)


@pytest.fixture
def client(engine):
    with TestClient(build_app(worker_settings(), engine=engine)) as c:
        yield c


@pytest.mark.parametrize("mode", ["discard_partial_items", None])
def test_interrupt_cancels_the_engine_request_and_the_socket_goes_on(client, engine, mode, caplog):
    caplog.set_level(logging.INFO, logger="server.api.responses_ws")
    with client.websocket_connect("/v1/responses") as ws:
        ws.send_text(create("ws-int", "Write a long story."))
        head = until(ws, ("response.output_text.delta",))
        rid = head[0]["response"]["id"]
        until(ws, ("response.output_text.delta",))  # decoding for a while
        interrupt = {"type": "response.interrupt", "response_id": rid}
        if mode is not None:
            interrupt["mode"] = mode
        steps, sent_at = engine.runs[0].steps, time.monotonic()
        ws.send_text(json.dumps(interrupt))
        tail = until(ws, TERMINAL)
        run = engine.wait_closed(0)
        kinds = [e["type"] for e in tail]
        assert {"type": "response.interrupt.accepted", "response_id": rid} in tail
        assert kinds.index("response.interrupt.accepted") < len(kinds) - 1
        done = tail[-1]
        assert done["type"] == "response.incomplete", kinds
        assert done["response"]["incomplete_details"] == {"reason": "interrupted"}
        assert not run.finished and run.steps <= steps + 3, (steps, run)  # ~one decode step after it
        usage = done["response"]["usage"]  # what the turn used until it was stopped (it was null)
        assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= run.steps + 1, (usage, run)
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        assert run.closed_at is not None and run.closed_at - sent_at < 1.0
        output = done["response"]["output"]
        if mode == "discard_partial_items":
            assert output == []  # the message being written is dropped
        else:
            assert [item["status"] for item in output] == ["incomplete"] and output[0]["content"][0]["text"]
        # the same socket takes the next turn, continuing from the interrupted response
        ws.send_text(create("ws-int", "Shorter, please.", previous_response_id=rid, max_output_tokens=3))
        after = until(ws, TERMINAL)[-1]
        assert after["type"] == "response.incomplete"
        assert after["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
        assert engine.runs[1].finished
    said = [r.getMessage() for r in caplog.records]
    assert any("interrupted by the client" in line and rid in line for line in said), said


def test_interrupt_naming_no_streaming_response_is_an_error_and_the_socket_lives_on(client):
    with client.websocket_connect("/v1/responses") as ws:
        ws.send_text(json.dumps({"type": "response.interrupt", "response_id": "resp_nope"}))
        error = json.loads(ws.receive_text())
        assert error["type"] == "error" and error["status"] == 400
        assert error["error"]["code"] == "response_not_found" and error["error"]["param"] == "response_id"
        ws.send_text(create("ws-int-2", "Hi.", max_output_tokens=2))
        done = until(ws, TERMINAL)[-1]
        assert done["type"] == "response.incomplete"
        ws.send_text(json.dumps({"type": "response.interrupt", "response_id": done["response"]["id"]}))
        late = json.loads(ws.receive_text())
        assert late["error"]["code"] == "response_already_completed"


def test_interrupt_during_the_prefill_stops_before_the_first_token(tokenizer):
    engine = SlowEngine(tokenizer, step_s=0.02, prefill_s=30.0)
    app = build_app(worker_settings(), engine=engine)
    with TestClient(app) as c, c.websocket_connect("/v1/responses") as ws:
        ws.send_text(create("ws-int-3", "Hi."))
        rid = until(ws, ("response.in_progress",))[0]["response"]["id"]
        ws.send_text(json.dumps({"type": "response.interrupt", "response_id": rid}))
        tail = until(ws, TERMINAL)
        assert tail[-1]["response"]["incomplete_details"] == {"reason": "interrupted"}
        run = engine.wait_closed(0, timeout_s=2.0)  # not the 30 s prefill
        assert run.steps == 0
        usage = tail[-1]["response"]["usage"]
        assert usage["input_tokens"] > 0 and usage["output_tokens"] == 0, usage


@pytest.mark.parametrize("prefill_s", [0.0, 30.0], ids=["decoding", "prefilling"])
def test_a_client_that_leaves_mid_stream_cancels_its_engine_request(tokenizer, prefill_s):
    """Also while nothing is sent (a long prefill): the socket is read while the turn runs."""
    engine = SlowEngine(tokenizer, step_s=0.02, prefill_s=prefill_s)
    app = build_app(worker_settings(), engine=engine)
    with TestClient(app) as c:
        with c.websocket_connect("/v1/responses") as ws:
            ws.send_text(create("ws-gone", "Write a long story."))
            until(ws, ("response.output_text.delta",) if not prefill_s else ("response.in_progress",))
            time.sleep(0.1)  # the engine has the request
            left_at = time.monotonic()
        run = engine.wait_closed(0)
    assert not run.finished and run.closed_at is not None and run.closed_at - left_at < 1.0
