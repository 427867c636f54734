"""The Engine ABC is the contract: everything chat uses is declared, and chat uses only that."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from server.chat.service import ChatService
from server.constrain.compiler import Compiler
from server.constrain.constraint import Constraint
from server.engines.base import Engine, EngineStats, GenerationChunk, GenerationRequest
from server.engines.hf.engine import HFEngine
from server.engines.vllm.engine import VllmEngine
from server.errors import InvalidRequest
from server.metrics import Metrics
from server.protocol import ChatCompletionRequest
from tests.conftest import worker_settings
from tests.engines.fake import ScriptedEngine


class _NoGenerate(Engine):
    name = "incomplete"

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def stats(self) -> EngineStats:
        return EngineStats()


class _Minimal(_NoGenerate):
    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        yield GenerationChunk([], 0, "stop")


def test_an_engine_missing_a_declared_method_cannot_be_built():
    with pytest.raises(TypeError, match="generate"):
        _NoGenerate()  # type: ignore[abstract]


def test_the_defaults_of_an_engine_that_has_nothing_to_say():
    eng = _Minimal()
    assert eng.health() is None
    assert eng.cache_tiers == ()
    assert eng.cache_location() == "the engine's KV cache"
    eng.reply_finished("s", ["f"])  # no session-aware cache: nothing happens, nothing raises
    eng.request_arrived("s")


@pytest.mark.parametrize("cls", [HFEngine, VllmEngine])
def test_both_engines_implement_the_contract(cls):
    assert issubclass(cls, Engine)
    assert not getattr(cls, "__abstractmethods__", None)


def _request(**extra):
    raw = {"model": worker_settings().served_model_name, "messages": [{"role": "user", "content": "hi"}]}
    raw.update(extra)
    return ChatCompletionRequest(**raw), raw


def test_chat_tells_the_engine_how_the_reply_ended_and_where_its_cache_lives(tokenizer):
    eng = ScriptedEngine(tokenizer, reply="plain text", tiers=("tier 1 (ram)", "tier 2 (the moon)"))
    service = ChatService(eng, worker_settings(), Metrics())
    assert service.cache_report.tier == "tier 2 (the moon)"  # the engine's last tier, asked, not probed
    req, raw = _request(prompt_cache_key="sess-1")
    prepared = service.prepare_chat(req, {}, raw_body=raw)
    assert eng.checked and eng.checked[-1] == prepared.sampling  # the engine's sampling check ran
    response = asyncio.run(service.complete(prepared))
    assert response["choices"][0]["message"]["content"] == "plain text"
    assert eng.finished == [(prepared.session.key, ())]  # a text reply: the session waits on a person
    assert eng.arrived == [prepared.session.key]  # told before the engine took it (issue 38 item 4)

    async def drain() -> None:
        async for _ in service.stream(service.prepare_chat(req, {}, raw_body=raw)):
            pass

    asyncio.run(drain())
    assert len(eng.finished) == 2 and eng.finished[1] == eng.finished[0]
    assert eng.arrived == [prepared.session.key] * 2  # the streaming path tells it too


def test_the_engine_refuses_sampling_it_cannot_honour_at_prepare_time(tokenizer):
    eng = ScriptedEngine(tokenizer)
    service = ChatService(eng, worker_settings(), Metrics())
    req, raw = _request(seed=13)
    with pytest.raises(InvalidRequest) as exc:
        service.prepare_chat(req, {}, raw_body=raw)
    assert exc.value.param == "seed"
    assert not eng.requests  # refused before anything reached the engine


def test_the_engine_gets_one_compiled_constraint_and_compiles_nothing(tokenizer):
    """Issue 35 item 2: chat compiles with its own Compiler; the seam carries one form."""
    assert [
        f.name for f in dataclasses.fields(GenerationRequest) if "spec" in f.name or "constr" in f.name
    ] == ["constraint"]
    assert "constraints" not in Engine.__annotations__  # no compiler on the ABC
    eng = ScriptedEngine(tokenizer, reply="plain text")
    assert not any(isinstance(v, Compiler) for v in vars(eng).values())
    service = ChatService(eng, worker_settings(), Metrics())
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    req, raw = _request(tools=[tool])
    prepared = service.prepare_chat(req, {}, raw_body=raw)
    compiled = prepared.constraint
    assert isinstance(compiled, Constraint) and compiled.matcher is not None
    assert compiled.spec.tools == [tool] and compiled.spec.eos_token_ids == eng.eos_token_ids
    asyncio.run(service.complete(prepared))
    assert eng.requests[-1].constraint is compiled  # handed over as compiled at prepare time
    plain, plain_raw = _request()
    asyncio.run(service.complete(service.prepare_chat(plain, {}, raw_body=plain_raw)))
    assert eng.requests[-1].constraint is None  # no tools: nothing to enforce
