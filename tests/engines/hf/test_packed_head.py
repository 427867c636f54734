"""The LM head as an MKL packed GEMM (CPU fp32): same logits as the stock linear within fp32 rounding."""

from __future__ import annotations

import pytest
import torch

from server.engines.hf.packed_head import PackedLinear, pack_lm_head, packed_linear_available

CPU = torch.device("cpu")
needs_mkl = pytest.mark.skipif(
    not packed_linear_available(CPU, torch.float32), reason="torch built without MKL's packed linear"
)


@needs_mkl
@pytest.mark.parametrize("shape", [(1, 64), (3, 64), (8, 64), (2, 5, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_the_stock_linear(shape, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 300, bias=bias)
    x = torch.randn(*shape)
    with torch.no_grad():
        want = linear(x)
        got = PackedLinear(linear)(x)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-5)


@needs_mkl
def test_a_row_gets_the_same_logits_batched_as_alone():
    torch.manual_seed(1)
    head = PackedLinear(torch.nn.Linear(64, 500, bias=False))
    x = torch.randn(8, 64)
    with torch.no_grad():
        batched = head(x)
        alone = torch.cat([head(x[i : i + 1]) for i in range(8)])
    assert torch.allclose(batched, alone, atol=1e-4, rtol=1e-5)


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 16)
        self.head = torch.nn.Linear(16, 100, bias=False)
        self.head.weight = self.embed.weight

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def set_output_embeddings(self, head: torch.nn.Module) -> None:
        self.head = head


@needs_mkl
def test_pack_lm_head_keeps_the_tied_weight_and_only_packs_cpu_fp32():
    model = _Tied()
    assert not pack_lm_head(model, CPU, torch.bfloat16)
    assert not pack_lm_head(model, torch.device("cuda"), torch.float32)
    assert isinstance(model.head, torch.nn.Linear)
    assert pack_lm_head(model, CPU, torch.float32)
    assert isinstance(model.head, PackedLinear)
    assert model.head.weight is model.embed.weight


@needs_mkl
def test_the_hf_engine_runs_its_lm_head_packed_on_cpu(hf_engine):
    head = hf_engine.model.get_output_embeddings()
    assert isinstance(head, PackedLinear)
    assert head.weight is hf_engine.model.get_input_embeddings().weight  # SmolLM2 ties them
