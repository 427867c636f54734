"""The LM head as an MKL packed GEMM on CPU (fp32), the way inductor runs fp32 CPU linears.

The LM head is the one big matmul of a small model's decode step (SmolLM2-135M: 49k x 576,
113 MB of fp32 weights read every step). ``torch.nn.functional.linear`` runs it as MKL sgemv /
sgemm on the plain weight; MKL's packed format (``torch.ops.mkl._mkl_reorder_linear_weight``,
once at load) halves a single-row head on this 2-core EPYC and takes ~18 % off an 8-row
batched one (CPU time, 1 thread: 9.6 -> 5.2 ms at 1 row, 20.2 -> 16.6 ms at 8 rows; measured
in benchmarks/results/concurrent_sessions.md). The other linear layers (576 to
1536 wide) showed no gain from packing and keep the stock path.

Logits differ from the stock path by fp32 rounding only (~1e-4 absolute, a different
accumulation order); a request batched or alone goes through the same packed GEMM. The
weight stays shared with the input embeddings (tied weights): the packed copy is extra.
"""

from __future__ import annotations

from typing import Any

import torch

# MKL's packing takes a batch-size hint; any number of rows can be run against the packed weight
BATCH_HINT = 8


def packed_linear_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch build has MKL's packed fp32 linear and the model runs on it (CPU fp32)."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkl.is_available()  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkl, "_mkl_linear")
    )


class PackedLinear(torch.nn.Module):
    """``linear`` with its weight packed once for MKL; same inputs and outputs as ``linear``."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # the same Parameter: tying and get_output_embeddings() keep working
        self.bias = linear.bias
        with torch.no_grad():
            self.register_buffer(
                "packed",
                torch.ops.mkl._mkl_reorder_linear_weight(self.weight.detach(), BATCH_HINT),
                persistent=False,
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        out: torch.Tensor = torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, rows)
        return out


def pack_lm_head(model: Any, device: torch.device, dtype: torch.dtype) -> bool:
    """Swap ``model``'s LM head for a ``PackedLinear`` where available; True if it did."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or not packed_linear_available(device, dtype):
        return False
    model.set_output_embeddings(PackedLinear(head))
    return True
