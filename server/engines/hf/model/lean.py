"""A decode step's (or batched prefill's) forward through the family's own layers, no model wrapper.

A decode step on CPU is small matmuls, and around them transformers' model forward does work
a step of one new token per row does not need: output dataclasses, mask construction,
kwargs routing, deprecation wrappers, a decoder layer and an attention module per layer.
On this 2-core EPYC, with fused projections, the engine's step went 41.1 -> 34.8 ms at 1 row
and 58.9 -> 52.7 ms at 8 rows (benchmarks/speed/decode_step_cpu.py; concurrent_sessions.md).
``decode_forward`` runs the same modules (embeddings, the rotary embedding, each layer's
norms, projections, MLP, the final norm, the LM head) in the decoder layer's order, with the
layer's work in fewer tensor ops: the norms as ``F.rms_norm`` (fp32), q/k/v (and gate/up) as
one matmul when fused (``linears/fused.py``), q and k rotated at once; attention goes to the
caller's cache and attention function (rows.py: decode and prefill).

Only for families whose decoder layer is exactly that (``LEAN_MODEL_TYPES``: pre-norm,
q/k/v projections with an optional per-head q/k norm, ``rotate_half`` rotary over the whole
head, attention, o_proj, residual,
post-attention norm, MLP, residual) and without sliding-window attention; any other model
runs transformers' forward. Logits equal transformers' forward within fp32 rounding (tests).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from server.engines.hf.linears.fused import LinearSlice

# transformers model types whose decoder layer is the Llama layer (Qwen3 adds q/k norms)
LEAN_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
_INNER = ("embed_tokens", "layers", "norm", "rotary_emb")
_LAYER = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")

Attention = Callable[..., tuple[torch.Tensor, Any]]


_SUPPORTED: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def lean_decode_supported(model: Any) -> bool:
    """Whether ``decode_forward`` reproduces ``model``'s forward (else use transformers'); asked once."""
    if model not in _SUPPORTED:
        _SUPPORTED[model] = _supported(model)
    return _SUPPORTED[model]


def use_transformers_forward(model: Any) -> None:
    """Run ``model`` through transformers' own forward even where the lean one applies (benchmarks)."""
    _SUPPORTED[model] = False


def _supported(model: Any) -> bool:
    config = model.config
    inner = getattr(model, "model", None)
    if config.model_type not in LEAN_MODEL_TYPES or inner is None:
        return False
    if not all(hasattr(inner, name) for name in _INNER) or len(inner.layers) != config.num_hidden_layers:
        return False
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if not all(hasattr(layer, name) for name in _LAYER) or not all(hasattr(attn, n) for n in _ATTN):
            return False
        # a sliding window changes which keys a row attends to: transformers' forward knows it
        if getattr(attn, "sliding_window", getattr(config, "sliding_window", None)) is not None:
            return False
    return True


Tensors = Callable[[torch.Tensor], Any]


def _norm(module: Any, dtype: torch.dtype) -> Tensors:
    """The layer's RMSNorm: fp32 as ONE fused op (``F.rms_norm``, the module's formula)."""
    eps = getattr(module, "variance_epsilon", None)
    if dtype != torch.float32 or eps is None or not type(module).__name__.endswith("RMSNorm"):
        return module.forward  # type: ignore[no-any-return]
    return lambda x: F.rms_norm(x, (x.shape[-1],), module.weight, eps)


def _qkv(attn: Any) -> Tensors:
    """(q and k side by side, v) of the layer's input: one matmul when they share a linear.

    q and k side by side get their rotary in one go; fused, they already are (a view).
    """
    q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
    fused = all(isinstance(p, LinearSlice) for p in (q, k, v)) and q.shared is k.shared is v.shared
    if fused and q.stop == k.start:
        shared = q.shared

        def one(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            y = shared.linear.forward(x)
            return y[..., q.start : k.stop], y[..., v.start : v.stop]

        return one
    return lambda x: (torch.cat((attn.q_proj(x), attn.k_proj(x)), dim=-1), attn.v_proj(x))


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` [B, heads, T, d] (cos/sin [B, 1, T, d]): the ``rotate_half`` form
    every family in ``LEAN_MODEL_TYPES`` applies (its ``apply_rotary_pos_emb``), q and k at once.

    ``rotate_half(x) * sin`` is ``roll(x, d/2) * signed_sin`` with the first half of ``sin``
    negated (``_signed``, once a forward): three ops a layer instead of six.
    """
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, -1), signed_sin)


def _signed(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with its first half negated (see ``_rotate``)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _mlp(mlp: Any) -> Tensors:
    """``down(act(gate(x)) * up(x))`` (the families' MLP): gate and up as one matmul when shared."""
    gate, up = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
    shared = getattr(gate, "shared", None)
    if not (isinstance(gate, LinearSlice) and isinstance(up, LinearSlice) and up.shared is shared):
        return mlp.forward  # type: ignore[no-any-return]
    act = mlp.act_fn

    def fused(x: torch.Tensor) -> torch.Tensor:
        y = shared.linear.forward(x)
        hidden = act(y[..., gate.start : gate.stop]) * y[..., up.start : up.stop]
        out: torch.Tensor = mlp.down_proj.forward(hidden)
        return out

    return fused


class _Layer:
    """One decoder layer's calls, resolved once (module ``__call__`` costs ~5 us; a step makes ~450)."""

    def __init__(self, layer: Any, dtype: torch.dtype) -> None:
        self.attn = layer.self_attn
        self.norm1 = _norm(layer.input_layernorm, dtype)
        self.norm2 = _norm(layer.post_attention_layernorm, dtype)
        self.qkv = _qkv(self.attn)
        self.mlp = _mlp(layer.mlp)
        self.qk_norm = hasattr(self.attn, "q_norm")  # Qwen3: RMSNorm over each head before rotary
        self.q_heads = self.attn.q_proj.out_features // self.attn.head_dim


_PLANS: weakref.WeakKeyDictionary[Any, list[_Layer]] = weakref.WeakKeyDictionary()


def _plan(model: Any) -> list[_Layer]:
    if model not in _PLANS:
        dtype = model.model.embed_tokens.weight.dtype
        _PLANS[model] = [_Layer(layer, dtype) for layer in model.model.layers]
    return _PLANS[model]


def decode_forward(
    model: Any,
    cache: Any,
    ids: torch.Tensor,
    positions: torch.Tensor,
    attention: Attention,
    last: torch.Tensor | None = None,
    **attn_kwargs: Any,
) -> torch.Tensor:
    """Logits [B, V] of ``ids`` [B, T] (at ``positions`` [B, T]) on top of ``cache``.

    A decode step has T = 1; a batched prefill (``rows.prefill_rows``) T new tokens per row,
    padded. ``cache.update(k, v, layer)`` stores the keys/values and returns what the layer
    attends to; ``attention(module, q, keys, values, None, scaling=..., **attn_kwargs)``
    returns [B, T, heads, head_dim] (transformers' attention-function signature). The logits
    are row i's at token ``last[i]`` (default: the last one).
    """
    inner = model.model
    batch, tokens = ids.shape
    embedded = inner.embed_tokens(ids)
    cos, sin = inner.rotary_emb(embedded, position_ids=positions)
    cos, sin = cos.unsqueeze(1), _signed(sin.unsqueeze(1))
    hidden = embedded.view(batch * tokens, -1)  # 2-D: a linear's input as it is (linears/onednn.py)
    for i, layer in enumerate(_plan(model)):
        attn, nq = layer.attn, layer.q_heads
        qk, v = layer.qkv(layer.norm1(hidden))
        qk = qk.view(batch, tokens, -1, attn.head_dim)
        v = v.view(batch, tokens, -1, attn.head_dim).transpose(1, 2)
        if layer.qk_norm:
            qk = torch.cat((attn.q_norm(qk[:, :, :nq]), attn.k_norm(qk[:, :, nq:])), dim=2)
        qk = _rotate(qk.transpose(1, 2), cos, sin)
        keys, values = cache.update(qk[:, nq:], v, i)
        out, _ = attention(attn, qk[:, :nq], keys, values, None, scaling=attn.scaling, **attn_kwargs)
        hidden = hidden + attn.o_proj.forward(out.reshape(batch * tokens, -1))
        hidden = hidden + layer.mlp(layer.norm2(hidden))
    hidden = hidden.view(batch, tokens, -1)
    rows = hidden[:, -1] if last is None else hidden[torch.arange(batch, device=hidden.device), last]
    logits: torch.Tensor = model.lm_head(inner.norm(rows))
    return logits
