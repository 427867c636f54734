"""The hf engine and the tool masks on CUDA (skipped without a GPU; CI has none).
from server.families.model_facts import load_model_facts

Runs on a random-weight small Llama with the embedded tokenizer, so the check needs no
model download: cached vs scratch logits, and a constrained tool call decoded on the GPU.
The tokenizer comes from the embedded model, or from AGENTSERVE_TEST_TOKENIZER (a folder).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import torch

from tests.engines.compiled import compiled

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"browser_{verb}",
            "parameters": {
                "type": "object",
                "properties": {"mode": {"enum": ["fast", "slow"]}},
                "required": ["mode"],
                "additionalProperties": False,
            },
        },
    }
    for verb in ("open", "click", "close", "scroll")
] + [
    {
        "type": "function",
        "function": {"name": "shell_exec", "parameters": {"type": "object", "properties": {}}},
    }
]


@pytest.fixture(scope="module")
def random_model_dir(tmp_path_factory) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    tok_dir = os.environ.get("AGENTSERVE_TEST_TOKENIZER")
    if tok_dir is None:
        from server.model_store import resolve_model

        tok_dir = str(resolve_model("embedded"))
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        eos_token_id=2,
        bos_token_id=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    out = tmp_path_factory.mktemp("random-llama")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def cuda_engine(random_model_dir):
    from server.config import load_settings
    from server.engines.hf.engine import HFEngine
    from server.families.model_facts import load_model_facts

    settings = load_settings(model=str(random_model_dir), device="cuda", dtype="float32")
    return HFEngine(settings.engine_settings(), load_model_facts(settings, "hf"))


def test_cached_logits_equal_scratch_on_cuda(cuda_engine):
    assert cuda_engine.device.type == "cuda"
    ids = list(range(100, 1100))
    _, cached = cuda_engine.prefill_logits(ids, "cuda-test")
    assert cached == 0
    reused, cached = cuda_engine.prefill_logits(ids + list(range(2000, 2040)), "cuda-test")
    assert cached == 992
    cuda_engine.cache.enabled = False
    try:
        fresh, _ = cuda_engine.prefill_logits(ids + list(range(2000, 2040)), "cuda-test")
    finally:
        cuda_engine.cache.enabled = True
    assert reused.device.type == "cuda"
    assert torch.max(torch.abs(reused - fresh)).item() < 1e-3  # fp32; TF32 matmuls may differ slightly


def test_masked_tool_call_on_cuda(cuda_engine):
    from server.chat.tool_choice import plan_tools
    from server.chat.toolcalls import parse_tool_calls
    from server.constrain.spec import ToolSpec
    from server.engines.base import GenerationRequest, SamplingParams
    from server.families.envelope import load_envelope

    env = load_envelope("hermes")
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name_prefix": "browser_"}}],
        },
    }
    prompt = cuda_engine.tokenizer("<|im_start|>user\nopen it<|im_end|>\n<|im_start|>assistant\n")[
        "input_ids"
    ]

    async def one(seed: int) -> str:
        plan = plan_tools(TOOLS, choice, [{"role": "user", "content": "x"}], False, None, env)
        spec = ToolSpec(TOOLS, plan, "hermes", "xgrammar", cuda_engine.eos_token_ids)
        prefill = cuda_engine.tokenizer(plan.prefill, add_special_tokens=False)["input_ids"]
        req = GenerationRequest(
            f"cuda-{seed}", prompt + prefill, SamplingParams(64, 1.0, seed=seed), compiled(cuda_engine, spec)
        )
        ids = []
        async for chunk in cuda_engine.generate(req):
            assert chunk.error is None, chunk.error
            ids += chunk.token_ids
        return plan.prefill + cuda_engine.tokenizer.decode(ids)

    async def run() -> list[str]:
        return [await one(seed) for seed in range(8)]

    for text in asyncio.run(run()):
        calls = parse_tool_calls(text, env).tool_calls
        assert len(calls) == 1, text
        assert calls[0].name.startswith("browser_")
        assert json.loads(calls[0].arguments)["mode"] in ("fast", "slow")


def test_batched_decode_equals_alone_on_cuda(cuda_engine, monkeypatch):
    """Batched decode on the GPU: the same tokens at T=0 (and logprobs within fp32 rounding) as alone."""
    from server.engines.hf import runner
    from tests.engines.hf.model.test_rows import TOLERANCE, _requests, _run

    widths: list[int] = []
    real = runner.decode_rows

    def spy(model, caches, tokens, device, *args):
        assert device.type == "cuda"
        widths.append(len(tokens))
        return real(model, caches, tokens, device, *args)

    monkeypatch.setattr(runner, "decode_rows", spy)
    tok = cuda_engine.tokenizer

    async def run():
        alone = [await _run(cuda_engine, r) for r in _requests(tok, "cuda-alone")]
        together = await asyncio.gather(
            *(_run(cuda_engine, r, delay=0.005 * i) for i, r in enumerate(_requests(tok, "cuda-both")))
        )
        return alone, together

    alone, together = asyncio.run(run())
    assert all(tokens for tokens, _ in alone)
    assert [t for t, _ in together] == [t for t, _ in alone]
    for (_, lp_alone), (_, lp_together) in zip(alone, together, strict=True):
        assert max(abs(a - b) for a, b in zip(lp_alone, lp_together, strict=True)) < TOLERANCE
    assert widths and max(widths) >= 3  # the running requests shared forwards on the GPU
