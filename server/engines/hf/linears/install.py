"""Which kernel runs the model's linear layers on CPU fp32: ``engine.cpu_linears``.

* ``auto`` (default): the packed-panel kernel (panel.py) for every layer whose outputs fill
  whole 32-column panels, where it builds and passes its self-check; oneDNN's matmul on a
  reordered weight (onednn.py) for the rest, or for all when the kernel is unavailable.
* ``panel``: the same, but an unavailable kernel stops the engine's start with the reason (a
  benchmark arm or a deployment that asked for the kernel never runs on something else).
* ``onednn``: oneDNN's matmul for every layer.

On any other device or dtype the layers stay torch's own. Installed on the engine thread,
after the projections are fused (fused.py), before the first forward (engine.py).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from server.engines.hf.linears.onednn import OneDNNLinear, onednn_linear_available
from server.engines.hf.linears.panel import PANEL, PanelLinear, panel_kernel, unavailable_reason

CpuLinears = Literal["auto", "panel", "onednn"]


def install_linears(model: Any, device: torch.device, dtype: torch.dtype, choice: CpuLinears = "auto") -> int:
    """Swap every ``nn.Linear`` of ``model`` as ``choice`` says (module doc); how many were swapped.

    The LM head keeps its plain weight (tied to the input embeddings; the engine reads the
    vocabulary size from it); the other layers' plain weights are dropped (no second copy).
    """
    if choice not in ("auto", "panel", "onednn"):
        raise ValueError(f"cpu_linears must be auto, panel or onednn, not {choice!r}")
    if device.type != "cpu" or dtype != torch.float32:
        return 0
    onednn = onednn_linear_available(device, dtype)
    panels = choice != "onednn" and panel_kernel() is not None
    if choice == "panel" and not panels:
        raise RuntimeError(
            f"engine.cpu_linears is 'panel' but the panel kernel is unavailable: {unavailable_reason()} "
            "(set cpu_linears: auto to fall back to oneDNN)"
        )
    if not onednn and not panels:
        return 0
    head = model.get_output_embeddings()
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            if panels and child.out_features % PANEL == 0:
                setattr(module, name, PanelLinear(child, keep_weight=child is head))
            elif onednn:
                setattr(module, name, OneDNNLinear(child, keep_weight=child is head))
            else:
                continue  # torch without oneDNN's linear: this layer stays torch's
            swapped += 1
    return swapped
