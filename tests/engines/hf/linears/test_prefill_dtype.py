"""engine.prefill_dtype: bfloat16 prefill on a float32 model, decode untouched.

A prefill's linears and attention compute in bfloat16 (close to float32's numbers, not equal);
outside a prefill every linear is its float32 kernel, bit for bit; a device without native
bfloat16 matmuls refuses to start instead of running it slowly; a bfloat16 model is left alone.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from server.config import ConfigError, load_settings
from server.engines.base import GenerationRequest, SamplingParams
from server.engines.hf.engine import HFEngine
from server.engines.hf.linears import prefill_dtype
from server.engines.hf.linears.install import install_linears
from server.engines.hf.linears.prefill_dtype import Bf16PrefillLinear, install_bf16_prefill, prefill
from server.families.model_facts import facts_of_model
from tests.engines.hf.tiny_models import tiny

CPU = torch.device("cpu")
PROMPT = [(7 * i + 3) % 290 + 5 for i in range(120)]


@pytest.fixture
def bf16_anywhere(monkeypatch):
    """Run the bfloat16 path on any CPU (emulated where it has no native bfloat16: slow, exact)."""
    monkeypatch.setattr(prefill_dtype, "cpu_has_bf16", lambda: True)


def _engine(model: Any, **overrides: Any) -> HFEngine:
    settings = load_settings(device="cpu", **overrides)
    engine = HFEngine(settings, facts_of_model(settings, None, model), model=model)
    asyncio.run(engine.start())
    return engine


def test_outside_a_prefill_every_linear_is_its_float32_kernel_bit_for_bit(bf16_anywhere):
    wrapped, plain = tiny("llama"), tiny("llama")
    assert install_bf16_prefill(wrapped, CPU) > 0
    install_linears(wrapped, CPU, torch.float32)
    wrappers = [m for m in wrapped.modules() if isinstance(m, Bf16PrefillLinear)]
    assert len(wrappers) == 2 * 7  # q, k, v, o, gate, up, down of 2 layers; not the LM head
    assert all(type(w.inner) is not torch.nn.Linear for w in wrappers)  # the CPU kernels run decode
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    for w in wrappers:
        if w.in_features == 64:
            ref = w.inner.forward(x)
            assert torch.equal(w(x), ref)  # decode: the float32 kernel itself
            with prefill(wrapped) as dtype:
                assert dtype is torch.bfloat16
                got = w(x)
            # the MLP's gate/up feed down_proj only: their product stays bfloat16 for it
            assert got.dtype == (torch.bfloat16 if w.feeds_a_linear else torch.float32)
            want = F.linear(x.bfloat16(), w.weight16, w.bias16)
            assert torch.equal(got.bfloat16(), want)
            assert not torch.equal(got.float(), ref) and torch.allclose(
                got.float(), ref, atol=0.05, rtol=0.05
            )
    assert sum(w.feeds_a_linear for w in wrappers) == 2 * 2
    with prefill(plain) as dtype:  # a model without the copies prefills in its own dtype
        assert dtype is None


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_bfloat16_prefill_is_close_to_float32s_and_its_attention_runs_bfloat16(
    family, bf16_anywhere, monkeypatch
):
    fp32 = _engine(tiny(family))
    bf16 = _engine(tiny(family), prefill_dtype="bfloat16")
    seen: list[torch.dtype] = []

    def spy(kernel: Any) -> Any:
        def call(q: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            seen.append(q.dtype)
            return kernel(q, *args, **kwargs)

        return call

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy(F.scaled_dot_product_attention))
    try:
        for ids in (PROMPT[:80], PROMPT):  # the second over the first's cached KV (masked rows)
            want, _ = fp32.prefill_logits(ids)
            seen.clear()
            got, cached = bf16.prefill_logits(ids)
            assert seen and set(seen) == {torch.bfloat16}
            assert (cached > 0) == (len(ids) == len(PROMPT))
            assert not torch.equal(got, want)
            assert float((got - want).abs().max()) < 0.1 * float(want.abs().max())
        # decode after it stays float32: a generated reply's steps attend in float32
        seen.clear()

        async def reply() -> list[int]:
            tokens: list[int] = []
            request = GenerationRequest("r", PROMPT[:50], SamplingParams(max_tokens=4, temperature=0.0))
            async for chunk in bf16.generate(request):
                tokens += chunk.token_ids
            return tokens

        assert len(asyncio.run(reply())) == 4
        assert torch.bfloat16 in seen and torch.float32 in seen
    finally:
        asyncio.run(fp32.shutdown())
        asyncio.run(bf16.shutdown())


def test_families_on_transformers_forward_prefill_their_linears_in_bfloat16(bf16_anywhere):
    model = tiny("mistral", sliding_window=8)  # a window: transformers' forward, not the rows one
    fp32, bf16 = _engine(copy.deepcopy(model)), _engine(model, prefill_dtype="bfloat16")
    try:
        want, _ = fp32.prefill_logits(PROMPT[:40])
        got, _ = bf16.prefill_logits(PROMPT[:40])
        assert not torch.equal(got, want)
        assert float((got - want).abs().max()) < 0.1 * float(want.abs().max())
    finally:
        asyncio.run(fp32.shutdown())
        asyncio.run(bf16.shutdown())


def test_a_cpu_without_native_bfloat16_refuses_to_start_and_says_what_to_set(monkeypatch):
    monkeypatch.setattr(prefill_dtype, "cpu_has_bf16", lambda: False)
    settings, model = load_settings(device="cpu", prefill_dtype="bfloat16"), tiny("llama")
    engine = HFEngine(settings, facts_of_model(settings, None, model), model=model)
    why = "hf engine could not start.*no native bfloat16.*prefill_dtype: auto"
    with pytest.raises(RuntimeError, match=why):
        asyncio.run(engine.start())
    assert engine.health() is None


def test_a_bfloat16_model_is_left_as_it_is(bf16_anywhere):
    engine = _engine(tiny("llama").to(torch.bfloat16), prefill_dtype="bfloat16")
    try:
        assert not any(isinstance(m, Bf16PrefillLinear) for m in engine.model.modules())
        logits, _ = engine.prefill_logits(PROMPT[:20])
        assert logits.dtype == torch.bfloat16
    finally:
        asyncio.run(engine.shutdown())


def test_the_setting_reaches_the_engine_and_is_checked():
    assert load_settings().engine_settings().prefill_dtype == "auto"
    assert load_settings(prefill_dtype="bfloat16").engine_settings().prefill_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="prefill_dtype"):
        load_settings(prefill_dtype="float16")
