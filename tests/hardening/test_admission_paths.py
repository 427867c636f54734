"""count_tokens and /detokenize work under admission like every request that costs CPU (issue 37 item 7):
count_tokens ran the full prepare (render, tokenize, grammar compiles) with no ticket, and /detokenize
decoded 8 MiB of ids on the event loop."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from tests.engines.fake import ScriptedEngine


@pytest.fixture(scope="module")
def app(tokenizer):
    from server.app import build_app
    from server.config import load_settings

    settings = load_settings(device="cpu", limits={"max_concurrent_requests": 1, "max_queued_requests": 1})
    return build_app(settings, engine=ScriptedEngine(tokenizer))


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app) as c:
        yield c


COUNT = {
    "model": "smollm2-135m-instruct",
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [{"name": "Read", "input_schema": {"type": "object", "properties": {"p": {"type": "string"}}}}],
}


def _full(app) -> list:
    return [app.state.admission.reserve() for _ in range(2)]  # running + queued: the worker is full


def test_count_tokens_is_refused_with_a_429_when_the_worker_is_full(app, client):
    assert client.post("/v1/messages/count_tokens", json=COUNT).status_code == 200
    assert app.state.admission.inside == 0  # its ticket is given back
    held = _full(app)
    try:
        r = client.post("/v1/messages/count_tokens", json=COUNT)
        assert r.status_code == 429, r.text  # was a 200: a flood of counts prepared with no bound
        assert r.json()["type"] == "error" and "limits.max_queued_requests" in r.json()["error"]["message"]
    finally:
        for t in held:
            t.release()


def test_detokenize_is_bounded_by_the_window_and_under_admission(app, client, tokenizer):
    ids = tokenizer("hello world", add_special_tokens=False)["input_ids"]
    assert client.post("/detokenize", json={"tokens": ids}).json()["prompt"] == "hello world"
    window = app.state.service.engine.max_model_len
    r = client.post("/detokenize", json={"tokens": [ids[0]] * (window + 1)})
    assert r.status_code == 400 and "context window" in r.json()["error"]["message"]
    held = _full(app)
    try:
        assert client.post("/detokenize", json={"tokens": ids}).status_code == 429
    finally:
        for t in held:
            t.release()
    assert app.state.admission.inside == 0
