"""q/k/v and gate/up as one matmul each: the family's forward returns what it returned unfused."""

from __future__ import annotations

import pytest
import torch

from server.engines.hf.kv.growing import cache_kw, growing_cache
from server.engines.hf.linears.fused import LinearSlice, SharedLinear, fuse_projections
from server.engines.hf.linears.install import install_linears
from server.engines.hf.linears.onednn import OneDNNLinear, onednn_linear_available
from server.engines.hf.linears.panel import PanelLinear
from tests.engines.hf.tiny_models import tiny

CPU = torch.device("cpu")


def _prefill_then_step(model, ids):
    kv = growing_cache(model.config)
    with torch.no_grad():
        first = model(input_ids=torch.tensor([ids]), **cache_kw(model, kv), use_cache=True).logits
        step = model(input_ids=torch.tensor([[7]]), **cache_kw(model, kv), use_cache=True).logits
    return first, step


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_a_fused_model_returns_the_unfused_logits(model_type):
    plain, fused = tiny(model_type), tiny(model_type)
    assert fuse_projections(fused) == 2 * fused.config.num_hidden_layers  # attention + MLP per layer
    attn = fused.model.layers[0].self_attn
    assert isinstance(attn.q_proj, LinearSlice) and attn.q_proj.shared is attn.v_proj.shared
    ids = list(range(3, 40))
    for want, got in zip(_prefill_then_step(plain, ids), _prefill_then_step(fused, ids), strict=True):
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_the_shared_product_is_dropped_once_every_slice_read_it():
    model = tiny("llama")
    fuse_projections(model)
    _prefill_then_step(model, list(range(3, 60)))
    shared = [m for m in model.modules() if isinstance(m, SharedLinear)]
    assert len(shared) == 4
    assert all(s._output is None and s._input is None for s in shared)  # no chunk's product kept


def test_a_slice_called_on_another_input_computes_its_own_columns():
    torch.manual_seed(0)
    q, k = torch.nn.Linear(8, 6), torch.nn.Linear(8, 4)
    holder = torch.nn.Module()
    holder.q_proj, holder.k_proj, holder.v_proj = q, k, torch.nn.Linear(8, 4)
    want_q, want_k = q.weight.detach().clone(), k.weight.detach().clone()
    assert fuse_projections(holder) == 1
    a, b = torch.randn(2, 8), torch.randn(2, 8)
    with torch.no_grad():
        got_q = holder.q_proj(a)  # the product of a is kept for k and v ...
        got_k = holder.k_proj(b)  # ... but k reads b: computed anew, not a's columns
    assert torch.allclose(got_q, a @ want_q.T + q.bias, atol=1e-6)
    assert torch.allclose(got_k, b @ want_k.T + k.bias, atol=1e-6)


def test_projections_of_different_inputs_or_shapes_stay_apart():
    holder = torch.nn.Module()
    holder.gate_proj, holder.up_proj = torch.nn.Linear(8, 6), torch.nn.Linear(9, 6)  # other input size
    holder.q_proj, holder.k_proj = torch.nn.Linear(8, 6), torch.nn.Linear(8, 6)  # no v_proj
    assert fuse_projections(holder) == 0
    assert type(holder.gate_proj) is torch.nn.Linear and type(holder.q_proj) is torch.nn.Linear


@pytest.mark.skipif(not onednn_linear_available(CPU, torch.float32), reason="torch without oneDNN's linear")
def test_the_oneDNN_swap_reorders_each_shared_linear_once():
    model = tiny("llama")
    fuse_projections(model)
    swapped = install_linears(model, CPU, torch.float32)
    # per layer: qkv, o, gate_up, down; plus the LM head
    assert swapped == 4 * model.config.num_hidden_layers + 1
    assert all(
        isinstance(s.linear, OneDNNLinear | PanelLinear)
        for s in model.modules()
        if isinstance(s, SharedLinear)
    )
    plain = tiny("llama")
    ids = list(range(3, 30))
    for want, got in zip(_prefill_then_step(plain, ids), _prefill_then_step(model, ids), strict=True):
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
