"""A request's tool spec is compiled once in the hf engine's process: at prepare time, used by the engine."""

from __future__ import annotations

import asyncio
import json

import pytest

from server.chat.service import ChatService
from server.constrain.envelope_compiler import EnvelopeCompiler
from server.errors import InvalidRequest
from server.metrics import Metrics
from server.protocol import ChatCompletionRequest
from tests.conftest import worker_settings

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture
def compiles(monkeypatch):
    """Every EnvelopeCompiler.build (a spec compiled into a constraint), counted."""
    calls: list[int] = []
    real = EnvelopeCompiler.build

    def counting(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(EnvelopeCompiler, "build", counting)
    return calls


def _request(**extra):
    raw = {
        "model": worker_settings().served_model_name,
        "messages": [{"role": "user", "content": "weather in Paris?"}],
        "tools": [TOOL],
        "tool_choice": "required",
        "max_tokens": 40,
        "temperature": 0,
    }
    raw.update(extra)
    return ChatCompletionRequest(**raw), raw


def test_the_spec_is_compiled_once_per_request(hf_engine, compiles):
    service = ChatService(hf_engine, worker_settings(), Metrics())
    req, raw = _request()
    prepared = service.prepare_chat(req, {}, raw_body=raw)
    assert len(compiles) == 1  # at prepare time (a bad schema is a 400 there)
    response = asyncio.run(service.complete(prepared))
    assert len(compiles) == 1  # the engine decoded under that constraint: no second compile
    calls = response["choices"][0]["message"]["tool_calls"]
    assert calls[0]["function"]["name"] == "get_weather"  # the mask still held
    assert "city" in json.loads(calls[0]["function"]["arguments"])


def test_a_second_generation_of_the_same_request_compiles_a_fresh_matcher(hf_engine, compiles):
    service = ChatService(hf_engine, worker_settings(), Metrics())
    req, raw = _request()
    prepared = service.prepare_chat(req, {}, raw_body=raw)
    first = asyncio.run(service.complete(prepared))
    again = asyncio.run(service.complete(prepared))  # the first matcher is spent: never reused
    assert len(compiles) == 2
    name = again["choices"][0]["message"]["tool_calls"][0]["function"]["name"]
    assert name == first["choices"][0]["message"]["tool_calls"][0]["function"]["name"]


def test_a_bad_schema_is_still_a_400_at_prepare_time(hf_engine):
    service = ChatService(hf_engine, worker_settings(), Metrics())
    schema = {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}
    bad = {"type": "function", "function": {"name": "f", "parameters": schema}}
    req, raw = _request(tools=[bad], tool_choice="required")
    with pytest.raises(InvalidRequest) as exc:
        service.prepare_chat(req, {}, raw_body=raw)
    assert exc.value.param == "tools"
