"""Projections that read the same input as one matmul: q/k/v, and the MLP's gate/up.

Every decoder family the hf engine loads computes ``q_proj(x)``, ``k_proj(x)`` and
``v_proj(x)`` from the same hidden states (and ``gate_proj(x)``, ``up_proj(x)`` in the MLP).
On a CPU decode step of a small model each matmul is a few rows against a weight, so the
calls themselves cost: SmolLM2-135M ran 211 linears a step. Concatenating each group's
weights into one ``nn.Linear`` (a ``SharedLinear``) makes that 121, each with a wider output
that two threads split better. Measured on this 2-core EPYC, embedded model, ~620-token
KV, oneDNN linears (benchmarks/results/concurrent_sessions.md): an 8-row decode step
80 -> 72 ms with transformers' forward.

The family's own modules still run: ``q_proj`` becomes a ``LinearSlice`` of the shared
linear. The first slice called with an input computes the whole product; the other
slices called with the SAME tensor take their columns of it (a view, no copy), and the
product is dropped once every slice has read it (a prefill chunk's product is MBs per
layer). A slice called with another input computes the product again: any call order
gives the same numbers, only the one transformers uses is fast. Outputs are the unfused
ones: each output column is the same dot product (bit-identical on CPU, measured).

Fusing runs before ``install_linears`` (install.py: it swaps the shared linears like any
other) and, like it, on the engine thread (``HFEngine``'s thread, engine.py): ``torch.cat`` of the
weights is the thread's first parallel op (linears/onednn.py).
"""

from __future__ import annotations

from typing import Any

import torch

# groups of projections a family's attention / MLP module computes from one input, in order
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class SharedLinear(torch.nn.Module):
    """One linear over the concatenated weights of ``readers`` projections of the same input.

    ``forward(x)`` returns the whole product; it is computed once per input tensor and
    kept until ``readers`` slices have read it.
    """

    def __init__(self, linear: torch.nn.Module, readers: int) -> None:
        super().__init__()
        self.linear = linear
        self.readers = readers
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._reads = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._input is not x or self._output is None:
            self._input, self._output, self._reads = x, self.linear(x), 0
        out = self._output
        self._reads += 1
        if self._reads >= self.readers:  # every slice has its columns: let the product go
            self._input = self._output = None
        return out


class LinearSlice(torch.nn.Module):
    """Columns ``start:stop`` of a ``SharedLinear``: what one of the fused projections returns.

    The first slice of a group owns the shared linear (a registered child, so ``.to()``,
    ``modules()`` and the oneDNN swap see it once); the others only point to it.
    """

    def __init__(self, shared: SharedLinear, start: int, stop: int, owner: bool) -> None:
        super().__init__()
        self.start, self.stop = start, stop
        self.out_features = stop - start
        if owner:
            self.shared = shared
        else:
            self.__dict__["shared"] = shared  # not a child: registered once, in the owner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.shared(x)[..., self.start : self.stop]
        return out


def _fusable(linears: list[Any]) -> bool:  # nn.Linears of one input size, dtype, device, bias or not
    if not all(type(lin) is torch.nn.Linear for lin in linears):
        return False
    first = linears[0].weight
    return all(
        lin.in_features == linears[0].in_features
        and lin.weight.dtype == first.dtype
        and lin.weight.device == first.device
        and (lin.bias is None) == (linears[0].bias is None)
        for lin in linears
    )


def fuse_projections(model: torch.nn.Module) -> int:
    """Replace every group of ``GROUPS`` found in ``model`` by slices of one linear; how many groups."""
    fused = 0
    for module in list(model.modules()):
        for names in GROUPS:
            found = [getattr(module, name, None) for name in names]
            if not _fusable(found):
                continue
            linears: list[torch.nn.Linear] = found  # type: ignore[assignment]  # checked by _fusable
            with torch.no_grad():
                weight = torch.cat([lin.weight for lin in linears], dim=0)
                bias = None if linears[0].bias is None else torch.cat([lin.bias for lin in linears])
            # built on the meta device: no random init of a weight about to be replaced
            whole = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
            whole.weight = torch.nn.Parameter(weight, requires_grad=False)
            if bias is not None:
                whole.bias = torch.nn.Parameter(bias, requires_grad=False)
            shared = SharedLinear(whole, len(names))
            start = 0
            for i, (name, lin) in enumerate(zip(names, linears, strict=True)):
                setattr(module, name, LinearSlice(shared, start, start + lin.out_features, owner=i == 0))
                start += lin.out_features
            fused += 1
    return fused
