"""Issue 55 item 5: a response echoes only what was rendered, each echoed string is bounded, and an
answer's JSON is built off the event loop. Before: a 99-byte /v1/responses/compact naming a stored
conversation returned 2.00 MiB (its items' unrendered keys, as sent), encoded on the loop; a 7 MiB
prompt_cache_key came back in every answer."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.testclient import TestClient

from server.app import build_app
from server.config import load_settings
from tests.engines.fake import ScriptedEngine

MODEL = "smollm2-135m-instruct"
JUNK = "x" * 200_000


@pytest.fixture
def client(tokenizer):
    with TestClient(build_app(load_settings(device="cpu"), engine=ScriptedEngine(tokenizer))) as c:
        yield c


def test_compact_echoes_user_messages_as_rendered(client):
    item = {
        "type": "message",
        "role": "user",
        "junk": JUNK,
        "content": [{"type": "input_text", "text": "hi"}],
    }
    item["content"][0]["junk"] = JUNK
    stored = client.post("/v1/responses", json={"model": MODEL, "input": [item], "max_output_tokens": 2})
    assert stored.status_code == 200, stored.text[:300]
    ask = {"model": MODEL, "previous_response_id": stored.json()["id"]}
    r = client.post("/v1/responses/compact", json=ask)
    assert r.status_code == 200, r.text[:300]
    assert len(r.content) < 4096, f"{len(json.dumps(ask))} bytes asked, {len(r.content)} answered"
    user = r.json()["output"][0]
    assert user == {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


@pytest.mark.parametrize(
    ("field", "most"), [("prompt_cache_key", 64), ("safety_identifier", 64), ("user", 256)]
)
def test_echoed_strings_are_bounded(client, field, most):
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 2}
    ok = client.post("/v1/responses", json={**body, field: "k" * most})
    assert ok.status_code == 200, ok.text[:300]
    r = client.post("/v1/responses", json={**body, field: "k" * (most + 1)})
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_unrendered_parts_of_tools_reasoning_and_text_are_not_echoed(client):
    function = {"type": "function", "name": "ls", "parameters": {"type": "object", "properties": {}}}
    body = {
        "model": MODEL,
        "input": "hi",
        "max_output_tokens": 2,
        "tools": [function, {"type": "web_search", "junk": JUNK}],
        "reasoning": {"effort": "low", "junk": JUNK},
        "text": {"format": {"type": "text"}, "junk": JUNK},
    }
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text[:300]
    assert len(r.content) < 8192
    got = r.json()
    assert got["tools"] == [function, {"type": "web_search"}]  # the function tool as sent
    assert got["reasoning"] == {"effort": "low"} and got["text"] == {"format": {"type": "text"}}
    stored = client.get(f"/v1/responses/{got['id']}")
    assert stored.status_code == 200 and stored.json()["tools"] == got["tools"]


def test_answers_are_encoded_off_the_event_loop(client, monkeypatch):
    import server.api.responses as responses
    import server.api.routes as routes

    on_loop: list[bool] = []
    encode = routes.json_bytes

    def watched(content):
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return encode(content)

    monkeypatch.setattr(routes, "json_bytes", watched)
    monkeypatch.setattr(responses, "json_bytes", watched)
    r = client.post("/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2})
    assert r.status_code == 200
    assert client.get(f"/v1/responses/{r.json()['id']}").status_code == 200
    chat = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/v1/chat/completions", json=chat).status_code == 200
    assert on_loop == [False, False, False]
