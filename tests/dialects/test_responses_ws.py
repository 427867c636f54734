"""Responses WebSocket mode (``/v1/responses`` upgraded; Codex with ``supports_websockets``) on the
embedded model, through starlette's TestClient (no WebSocket package needed in-process)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from server.app import build_app
from server.config import AuthSettings
from tests.conftest import worker_settings

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
RULES = "You are a careful coding agent. " + " ".join(f"Rule {i}: check your work." for i in range(30))
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def create(key: str, *items: dict[str, Any], **kw: Any) -> dict[str, Any]:
    body = {"model": MODEL, "instructions": RULES, "input": list(items), "prompt_cache_key": key}
    return {"max_output_tokens": 4, "temperature": 0, "store": False, **body, **kw}


def turn(ws: Any, message: dict[str, Any]) -> list[dict[str, Any]]:
    """Send one message; the events up to the terminal one."""
    ws.send_text(json.dumps({"type": "response.create", **message}))
    events: list[dict[str, Any]] = []
    for _ in range(1000):
        events.append(json.loads(ws.receive_text()))
        if events[-1]["type"] in TERMINAL:
            return events
    raise AssertionError(f"no terminal event in {len(events)} events")


def sse_events(client: TestClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


@pytest.fixture(scope="module")
def client(hf_engine):
    with TestClient(build_app(worker_settings(), engine=hf_engine)) as c:
        yield c


def test_socket_sends_the_sse_events_as_messages(client):
    body = create("ws-same", user("Say hello."))
    over_http = sse_events(client, body)
    with client.websocket_connect("/v1/responses") as ws:
        over_ws = turn(ws, body)
    assert [e["type"] for e in over_ws] == [e["type"] for e in over_http]
    assert over_ws[0]["type"] == "response.created" and over_ws[-1]["type"] == "response.incomplete"
    assert [e.get("delta") for e in over_ws] == [e.get("delta") for e in over_http]
    assert [e["sequence_number"] for e in over_ws] == list(range(len(over_ws)))


def test_store_false_turn_continues_from_the_sockets_latest_response(client):
    with client.websocket_connect("/v1/responses") as ws:
        first = turn(ws, create("ws-chain", user("Say hello.")))[-1]["response"]
        second = turn(ws, create("ws-chain", user("Now say goodbye."), previous_response_id=first["id"]))[-1][
            "response"
        ]
    assert second["status"] in ("completed", "incomplete")
    # turn 2's prompt holds turn 1's (only the new item was sent) and reuses it from the cache
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"] + 5
    cached = second["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["input_tokens"] - 1, (first["usage"], second["usage"])


def test_unknown_previous_response_is_an_error_message_and_the_socket_lives_on(client):
    with client.websocket_connect("/v1/responses") as ws:
        (error,) = turn(ws, create("ws-unknown", user("Hi."), previous_response_id="resp_nope"))
        assert error["type"] == "error" and error["status"] == 400
        assert error["error"]["code"] == "previous_response_not_found"
        assert error["error"]["param"] == "previous_response_id"
        # a store: false response of another socket is not this socket's either
        events = turn(ws, create("ws-unknown", user("Hi.")))
        assert events[-1]["type"] == "response.incomplete"
    with client.websocket_connect("/v1/responses") as other:
        rid = events[-1]["response"]["id"]
        (error,) = turn(other, create("ws-unknown", user("Again."), previous_response_id=rid))
        assert error["error"]["code"] == "previous_response_not_found"


def test_warm_up_generates_nothing_and_the_next_turn_continues_from_it(client):
    with client.websocket_connect("/v1/responses") as ws:
        warm = turn(ws, create("ws-warm", user("Read a.py."), generate=False))
        assert [e["type"] for e in warm] == ["response.created", "response.in_progress", "response.completed"]
        done = warm[-1]["response"]
        assert done["output"] == [] and done["status"] == "completed" and done["id"].startswith("resp_")
        ws.send_text(json.dumps({"type": "response.processed", "response_id": done["id"]}))  # no answer
        real = turn(ws, create("ws-warm", user("Go on."), previous_response_id=done["id"]))[-1]["response"]
    fresh = turn_alone(client, create("ws-warm-2", user("Read a.py."), user("Go on.")))
    assert real["usage"]["input_tokens"] == fresh["usage"]["input_tokens"]  # the warm-up's input counted


def turn_alone(client: TestClient, message: dict[str, Any]) -> dict[str, Any]:
    with client.websocket_connect("/v1/responses") as ws:
        response: dict[str, Any] = turn(ws, message)[-1]["response"]
        return response


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"type": "session.update"}), "unknown message type 'session.update'"),
        (json.dumps({"type": "response.create", "model": MODEL}), "input"),
        (json.dumps({"type": "response.create", "input": "x", "background": True}), "background"),
    ],
)
def test_bad_messages_are_400_error_messages(client, text, needle):
    with client.websocket_connect("/v1/responses") as ws:
        ws.send_text(text)
        error = json.loads(ws.receive_text())
    assert error["type"] == "error" and error["status"] == 400, error
    assert needle in error["error"]["message"]
    assert error["error"]["type"] == "invalid_request_error"


def test_socket_needs_the_same_key_as_http(hf_engine):
    settings = worker_settings().model_copy(update={"auth": AuthSettings(api_keys={"t": "sk-good"})})
    with TestClient(build_app(settings, engine=hf_engine)) as c:
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
            with pytest.raises(WebSocketDenialResponse) as denied:
                with c.websocket_connect("/v1/responses", headers=headers):
                    pass
            assert denied.value.status_code == 401
            assert denied.value.json()["error"]["type"] == "authentication_error"
        for headers in ({"x-api-key": "sk-good"}, {"Authorization": "Bearer sk-good"}):
            with c.websocket_connect("/v1/responses", headers=headers) as ws:
                events = turn(ws, create("ws-auth", user("Hi."), generate=False))
            assert events[-1]["type"] == "response.completed"
