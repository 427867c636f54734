"""Issue 36 item 7: Messages ``max_tokens: 0`` warms the prompt cache; OpenAI's ``prompt_cache_options``
``mode`` / ``ttl`` and per-part ``prompt_cache_breakpoint`` are accepted, their ttl a retention hint."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import build_app
from server.dialects.messages.request import MessagesBody, convert
from server.protocol import ChatCompletionRequest
from tests.conftest import worker_settings

MODEL = "smollm2-135m-instruct"
SYSTEM = "You are a careful assistant. " * 40  # a prefix worth a few cache blocks


def test_max_tokens_zero_converts_to_a_one_token_warm_up():
    body = {"model": MODEL, "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}
    converted = convert(MessagesBody.model_validate(body), body)
    assert converted.warm_up and converted.chat.max_tokens == 1
    body["max_tokens"] = 5
    converted = convert(MessagesBody.model_validate(body), body)
    assert not converted.warm_up and converted.chat.max_tokens == 5


def chat_hint(**body: Any) -> float:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body}
    return ChatCompletionRequest.model_validate(body).retention_hint_s()


def test_prompt_cache_options_ttl_and_breakpoints_are_retention_hints():
    assert chat_hint(prompt_cache_options={"mode": "explicit"}) == 0.0  # mode alone: no hint
    assert chat_hint(prompt_cache_options={"mode": "implicit", "ttl": "30m"}) == 1800.0
    assert chat_hint(prompt_cache_options={"ttl": "12h"}, prompt_cache_retention="24h") == 86400.0
    part = {"type": "text", "text": "hi", "prompt_cache_breakpoint": {"mode": "explicit"}}
    user = {"role": "user", "content": [part]}
    assert chat_hint(messages=[user]) == 1800.0  # a breakpoint without ttl: 30m
    assert chat_hint(messages=[user], prompt_cache_options={"ttl": "12h"}) == 43200.0  # inherits
    part["prompt_cache_breakpoint"] = {"mode": "explicit", "ttl": "12h"}
    assert chat_hint(messages=[user]) == 43200.0


@pytest.mark.e2e
def test_bad_prompt_cache_options_are_400s_naming_them(hf_engine):
    with TestClient(build_app(worker_settings(), engine=hf_engine)) as c:
        for options in ({"ttl": "1h"}, {"mode": "sometimes"}):
            body = {"model": MODEL, "input": "hi", "max_output_tokens": 2, "prompt_cache_options": options}
            r = c.post("/v1/responses", json=body)
            assert r.status_code == 400, r.text
            assert "prompt_cache_options" in (r.json()["error"]["param"] or ""), r.text
        body = {
            "model": MODEL,
            "input": "hi",
            "max_output_tokens": 2,
            "prompt_cache_options": {"mode": "explicit", "ttl": "30m"},
            "prompt_cache_key": "opts-resp",
        }
        r = c.post("/v1/responses", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["cache"]["retention_hint"]["requested_s"] == 1800.0


@pytest.mark.e2e
def test_messages_max_tokens_zero_caches_the_prompt_and_writes_nothing(hf_engine):
    ask = {
        "model": MODEL,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": "hi"}],
        "prompt_cache_key": "warm-up",
        "temperature": 0,
    }
    with TestClient(build_app(worker_settings(), engine=hf_engine)) as c:
        r = c.post("/v1/messages", json={**ask, "max_tokens": 0})
        assert r.status_code == 200, r.text
        warm = r.json()
        assert warm["content"] == [] and warm["stop_reason"] == "max_tokens"
        assert warm["usage"]["output_tokens"] == 0 and warm["usage"]["input_tokens"] > 200
        r = c.post("/v1/messages", json={**ask, "max_tokens": 2})
        assert r.status_code == 200, r.text
        used = r.json()["usage"]
        prompt = used["input_tokens"] + used["cache_read_input_tokens"]
        assert used["cache_read_input_tokens"] >= 0.9 * prompt, used  # the warm-up's prefill was kept
        with c.stream("POST", "/v1/messages", json={**ask, "max_tokens": 0, "stream": True}) as s:
            assert s.status_code == 200
            events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
        kinds = [e["type"] for e in events]
        assert kinds == ["message_start", "ping", "message_delta", "message_stop"], kinds
        assert events[2]["delta"]["stop_reason"] == "max_tokens" and events[2]["usage"]["output_tokens"] == 0
