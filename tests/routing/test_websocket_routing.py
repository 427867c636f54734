"""The router in front of the Responses WebSocket mode (Codex with ``supports_websockets``): the socket is
placed by session like an HTTP POST, auth is checked before the upgrade, messages are relayed both
ways and a close on either side closes the other."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from server.config import AuthSettings, RoutingSettings, Settings, WebSocketSettings
from server.ws_gate import MAX_MESSAGE_HEADER
from tests.routing.conftest import RouterThread
from tests.routing.conftest import test_settings as router_settings

pytestmark = pytest.mark.timeout(60)
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


def ws_url(r: RouterThread) -> str:
    return r.url.replace("http://", "ws://") + "/v1/responses"


def create(**fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": "fake", "input": "hi", **fields})


def turn(ws: ClientConnection, message: str) -> list[dict[str, Any]]:
    """Send a message; the events up to the terminal one."""
    ws.send(message)
    events = [json.loads(ws.recv(timeout=60))]
    while events[-1]["type"] not in TERMINAL:
        events.append(json.loads(ws.recv(timeout=60)))
    return events


def http_worker(r: RouterThread, headers: dict[str, str], **fields: Any) -> str:
    """The fake worker (its own id) an HTTP POST /v1/responses with these fields lands on."""
    body = {"model": "fake", "input": "hi", **fields}
    resp = httpx.post(r.url + "/v1/responses", json=body, headers=headers, timeout=10)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["system_fingerprint"])


@pytest.fixture
def two(workers, make_router):
    return make_router([w.url for w in workers[:2]])


@pytest.mark.parametrize("placed_by", ["prompt_cache_key", "x-session-id"])
def test_a_socket_lands_on_its_sessions_worker_and_continues_there(two, workers, placed_by):
    homes = {}
    for i in range(12):
        key = f"thread-{i}"
        fields = {"prompt_cache_key": key} if placed_by == "prompt_cache_key" else {}
        headers = {"x-session-id": key} if placed_by == "x-session-id" else {}
        homes[key] = http_worker(two, headers, **fields)
        with connect(ws_url(two), additional_headers=headers) as ws:
            first = turn(ws, create(**fields))
            assert [e["type"] for e in first] == ["response.created", "response.completed"]
            assert first[-1]["response"]["output_text"] == homes[key]  # the HTTP requests' worker
            prev = first[-1]["response"]["id"]
            second = turn(ws, create(previous_response_id=prev, input=[{"role": "user", "content": "go on"}]))
            assert second[-1]["type"] == "response.completed", second
            assert second[-1]["response"]["output_text"] == homes[key]
    assert len(set(homes.values())) == 2  # both workers took sessions: placement, not a fixed worker
    logged = [rec for w in workers[:2] for rec in w.log() if rec.get("websocket")]
    assert len(logged) == 24  # one worker message per client message, nothing lost or repeated
    assert sorted(rec["session"] for rec in logged if rec["previous_response_id"] is None) == sorted(homes)


def test_a_worker_that_closes_closes_the_client(two, workers):
    for w in workers[:2]:
        w.configure(ws_close_after=1)
    with connect(ws_url(two)) as ws:
        assert turn(ws, create(prompt_cache_key="closing"))[-1]["type"] == "response.completed"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001  # the worker's own code


def test_a_client_that_closes_ends_the_relay(two, workers):
    with connect(ws_url(two)) as ws:
        turn(ws, create(prompt_cache_key="leaving"))
    # the router is fine afterwards: a new socket (same session) is served
    with connect(ws_url(two)) as ws:
        assert turn(ws, create(prompt_cache_key="leaving"))[-1]["type"] == "response.completed"


KEYS = {"team-a": "key-a"}


def test_a_bad_key_is_refused_before_the_upgrade(workers):
    settings = Settings(
        auth=AuthSettings(api_keys=KEYS, router_token="rt"),
        routing=RoutingSettings(health_interval_s=0.2, health_failures=1),
    )
    r = RouterThread(settings, [w.url for w in workers[:2]]).start()
    try:
        for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}):
            with pytest.raises(InvalidStatus) as refused:
                connect(ws_url(r), additional_headers=headers).close()
            assert refused.value.response.status_code == 401, headers
            assert json.loads(refused.value.response.body)["error"]["type"] == "authentication_error"
        assert not any(w.log() for w in workers)
        for headers in ({"x-api-key": "key-a"}, {"Authorization": "Bearer key-a"}):
            with connect(ws_url(r), additional_headers=headers) as ws:
                assert turn(ws, create(prompt_cache_key="keyed"))[-1]["type"] == "response.completed"
        logged = [rec for w in workers for rec in w.log()]
        assert [(rec["tenant"], rec["router_token"]) for rec in logged] == [("team-a", "rt")] * 2
    finally:
        r.stop()


def test_the_router_counts_its_sockets_and_checks_the_origin(workers):
    """The router's own gate (server/ws_gate.py): past websocket.max_sockets an upgrade is a 503 with
    the router's HTTP still up; a browser origin is refused on a keyless router; the 101 names the
    message limit; a socket that closes frees its place."""
    settings = router_settings().model_copy(update={"websocket": WebSocketSettings(max_sockets=2)})
    r = RouterThread(settings, [w.url for w in workers[:2]]).start()
    try:
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url(r), additional_headers={"origin": "http://evil.example"}).close()
        assert refused.value.response.status_code == 403
        with connect(ws_url(r)) as a, connect(ws_url(r)) as b:
            limit = str(settings.limits.max_request_bytes)
            assert a.response.headers[MAX_MESSAGE_HEADER] == limit
            with pytest.raises(InvalidStatus) as busy:
                connect(ws_url(r)).close()
            assert busy.value.response.status_code == 503
            assert json.loads(busy.value.response.body)["error"]["code"] == "too_many_websockets"
            assert httpx.get(r.url + "/health", timeout=10).status_code == 200
            assert turn(b, create(prompt_cache_key="gated"))[-1]["type"] == "response.completed"
        with connect(ws_url(r)) as c:  # both closed: room again
            assert turn(c, create(prompt_cache_key="gated"))[-1]["type"] == "response.completed"
    finally:
        r.stop()


RULES = "You are a careful coding agent. " + " ".join(f"Rule {i}: check your work." for i in range(40))


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_real_workers_a_socket_reuses_its_sessions_cache_and_continues(embedded_model_dir):
    """`agentserve serve --workers 2`: a socket placed by its prompt_cache_key lands where the session's
    HTTP request did (its prompt is read from that worker's cache), and a previous_response_id turn
    sending only its new item succeeds on the same worker (the socket's own memory is there)."""
    from tests.routing.conftest import real_cluster

    def body(key: str, *items: str, **kw: Any) -> dict[str, Any]:
        user = [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": t}]} for t in items
        ]
        return {
            "model": "smollm2-135m-instruct",
            "instructions": RULES,
            "input": user,
            "prompt_cache_key": key,
            "max_output_tokens": 3,
            "temperature": 0,
            "store": False,
            **kw,
        }

    with real_cluster(2, health_interval_s=2) as (url, _):
        for key in ("ws-real-a", "ws-real-b", "ws-real-c"):
            resp = httpx.post(url + "/v1/responses", json=body(key, "Say hello."), timeout=120)
            assert resp.status_code == 200, resp.text
            with connect(url.replace("http://", "ws://") + "/v1/responses") as ws:
                first = turn(ws, json.dumps({"type": "response.create", **body(key, "Say hello.")}))[-1]
                assert first["type"] in ("response.completed", "response.incomplete"), first
                usage = first["response"]["usage"]
                assert usage["input_tokens_details"]["cached_tokens"] >= usage["input_tokens"] - 32, usage
                more = body(key, "Now say goodbye.", previous_response_id=first["response"]["id"])
                second = turn(ws, json.dumps({"type": "response.create", **more}))[-1]
                assert second["type"] in ("response.completed", "response.incomplete"), second
                assert second["response"]["usage"]["input_tokens"] > usage["input_tokens"]
