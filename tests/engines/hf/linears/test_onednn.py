"""Linear layers as oneDNN matmuls (CPU fp32): same outputs as the stock linear within fp32 rounding."""

from __future__ import annotations

import pytest
import torch

from server.engines.hf.linears.install import install_linears
from server.engines.hf.linears.onednn import OneDNNLinear, onednn_linear_available
from server.engines.hf.linears.panel import PanelLinear, panel_linear_available

CPU = torch.device("cpu")
needs_onednn = pytest.mark.skipif(
    not onednn_linear_available(CPU, torch.float32), reason="torch built without oneDNN's linear"
)


@needs_onednn
@pytest.mark.parametrize("shape", [(1, 64), (3, 64), (8, 64), (17, 64), (2, 5, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_linear_equals_the_stock_linear(shape, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 300, bias=bias)
    x = torch.randn(*shape)
    with torch.no_grad():
        want = linear(x)
        got = OneDNNLinear(linear)(x)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-5)


@needs_onednn
def test_a_row_gets_the_same_output_batched_as_alone():
    torch.manual_seed(1)
    head = OneDNNLinear(torch.nn.Linear(64, 500, bias=False))
    x = torch.randn(8, 64)
    with torch.no_grad():
        batched = head(x)
        alone = torch.cat([head(x[i : i + 1]) for i in range(8)])
    assert torch.allclose(batched, alone, atol=1e-4, rtol=1e-5)


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 16)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 16, bias=False))
        self.head = torch.nn.Linear(16, 100, bias=False)
        self.head.weight = self.embed.weight

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.mlp(self.embed(ids)))
        return out


@needs_onednn
def test_every_linear_is_swapped_the_tied_head_keeps_its_weight_and_only_cpu_fp32():
    model = _Tied()
    ids = torch.tensor([[1, 5, 7]])
    with torch.no_grad():
        want = model(ids)
    assert install_linears(model, CPU, torch.bfloat16) == 0
    assert install_linears(model, torch.device("cuda"), torch.float32) == 0
    assert isinstance(model.head, torch.nn.Linear)
    assert install_linears(model, CPU, torch.float32) == 3
    # 32 outputs fill a panel: the packed kernel where it is built (linears/panel.py); else oneDNN
    panels = PanelLinear if panel_linear_available(CPU, torch.float32) else OneDNNLinear
    assert isinstance(model.mlp[0], panels)
    assert all(isinstance(m, OneDNNLinear) for m in (model.head, model.mlp[1]))  # 100 and 16 outputs
    assert model.head.weight is model.embed.weight
    assert not hasattr(model.mlp[0], "weight") and not hasattr(model.mlp[1], "weight")  # no plain copy
    with torch.no_grad():
        assert torch.allclose(model(ids), want, atol=1e-4, rtol=1e-5)


@needs_onednn
def test_the_hf_engine_runs_its_linears_on_onednn_on_cpu(hf_engine):
    import asyncio

    asyncio.run(hf_engine.start())  # the engine thread reorders them, before start() returns
    model = hf_engine.model
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    head = model.get_output_embeddings()
    assert isinstance(head, PanelLinear if panel_linear_available(CPU, torch.float32) else OneDNNLinear)
    assert head.weight is model.get_input_embeddings().weight  # SmolLM2 ties them
