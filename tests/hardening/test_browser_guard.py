"""Issue 55 item 7: what a web page can make a browser send is refused, worker and router alike.

A POST without a JSON content type (``text/plain``, a form, no type: what a page sends cross-origin
without a preflight) is a 415 on every POST path; a ``Host`` a keyless server does not serve
(DNS rebinding: the page's own name, now pointing at 127.0.0.1) is a 421 naming
``auth.allowed_hosts``. A scripted engine: nothing here generates."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from server.app import build_app
from server.config import load_settings
from server.routing.router_app import create_router_app
from tests.engines.fake import ScriptedEngine

MODEL = "smollm2-135m-instruct"
CHAT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
POSTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"model": MODEL, "max_tokens": 2, "prompt": "hi"}),
    ("/v1/responses", {"model": MODEL, "max_output_tokens": 2, "input": "hi"}),
    ("/v1/responses/compact", {"model": MODEL, "input": "hi"}),
    ("/v1/messages", CHAT),
    ("/v1/messages/count_tokens", {"model": MODEL, "messages": CHAT["messages"]}),
    ("/tokenize", {"prompt": "hi"}),
    ("/detokenize", {"tokens": [1]}),
]
SIMPLE_TYPES = [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"]


@pytest.fixture
def worker(tokenizer):
    engine = ScriptedEngine(tokenizer)
    with TestClient(build_app(load_settings(device="cpu"), engine=engine)) as client:
        yield client, engine


def _post(client: TestClient, path: str, body: dict[str, Any], content_type: str | None, **headers: str):
    if content_type is not None:
        headers["content-type"] = content_type
    return client.post(path, content=json.dumps(body).encode(), headers=headers)


@pytest.mark.parametrize("content_type", SIMPLE_TYPES)
def test_every_post_without_a_json_type_is_a_415(worker, content_type):
    client, engine = worker
    for path, body in POSTS:
        r = _post(client, path, body, content_type)
        assert r.status_code == 415, (path, r.status_code, r.text[:200])
        error = r.json()["error"]
        assert "Content-Type: application/json" in error["message"]
        if path.startswith("/v1/messages"):  # Anthropic's shape on its paths
            assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
        else:
            assert error["code"] == "unsupported_media_type"
    assert engine.requests == []  # nothing ran


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8"])
def test_json_posts_are_served(worker, content_type):
    client, engine = worker
    for path, body in POSTS:
        r = _post(client, path, body, content_type)
        assert r.status_code == 200, (path, r.text[:300])
    assert engine.requests  # the generating paths ran


REBOUND = ["evil.example", "evil.example:8000", "rebind.attacker.com.", "EVIL.example:1"]
SERVED = ["localhost:8000", "127.0.0.1:8000", "[::1]:8000", "10.1.2.3", "worker-1:8000", "app.localhost"]


@pytest.mark.parametrize("host", REBOUND)
def test_a_keyless_worker_refuses_a_rebound_host(worker, host):
    client, engine = worker
    for method, path, body in [("POST", "/v1/responses", POSTS[2][1]), ("GET", "/v1/models", None)]:
        r = client.request(method, path, json=body, headers={"host": host})
        assert r.status_code == 421, (path, r.status_code)
        assert r.json()["error"]["code"] == "host_not_allowed"
        assert "auth.allowed_hosts" in r.json()["error"]["message"]
    assert client.get("/metrics", headers={"host": host}).status_code == 421
    assert client.get("/health", headers={"host": host}).status_code == 200  # probes: never
    assert engine.requests == []
    with pytest.raises(WebSocketDenialResponse) as denied:
        with client.websocket_connect("/v1/responses", headers={"host": host}):
            pass
    assert denied.value.status_code == 421


@pytest.mark.parametrize("host", SERVED)
def test_loopback_ip_and_one_label_hosts_are_served(worker, host):
    client, _ = worker
    assert client.post("/v1/responses", json=POSTS[2][1], headers={"host": host}).status_code == 200


def test_allowed_hosts_adds_names_and_keys_decide_unless_set(tokenizer):
    engine = ScriptedEngine(tokenizer)
    listed = load_settings(device="cpu", auth={"allowed_hosts": ["api.example.com", "*.corp.example"]})
    with TestClient(build_app(listed, engine=engine)) as c:
        for host, status in [("api.example.com", 200), ("a.corp.example:80", 200), ("evil.example", 421)]:
            assert c.get("/v1/models", headers={"host": host}).status_code == status, host
    keyed = load_settings(device="cpu", auth={"api_keys": {"team": "sk-1"}})
    with TestClient(build_app(keyed, engine=engine)) as c:
        assert c.get("/v1/models", headers={"host": "evil.example"}).status_code == 401  # the key decides
        ok = c.get("/v1/models", headers={"host": "evil.example", "authorization": "Bearer sk-1"})
        assert ok.status_code == 200


def test_the_router_refuses_both_at_its_edge():
    app = create_router_app(load_settings(device="cpu"), ["http://127.0.0.1:9"])  # no worker needed
    with TestClient(app) as c:
        for path, body in POSTS[:6]:
            r = _post(c, path, body, "text/plain")
            assert r.status_code == 415, (path, r.text[:200])
        r = c.post("/v1/responses", json=POSTS[2][1], headers={"host": "evil.example"})
        assert r.status_code == 421 and "auth.allowed_hosts" in r.json()["error"]["message"]
        assert c.get("/workers", headers={"host": "evil.example"}).status_code == 421
        with pytest.raises(WebSocketDenialResponse) as denied:
            with c.websocket_connect("/v1/responses", headers={"host": "evil.example"}):
                pass
        assert denied.value.status_code == 421
        assert c.get("/health", headers={"host": "evil.example"}).status_code != 421
