"""The model's linear layers on CPU fp32 as a small C kernel over weights packed in 32-column panels.

A decode step on CPU is weight-bound: every step reads every weight once, and the fewer
rows it has (1 to 16) the more the read speed is the step's speed. oneDNN's matmul on its
reordered weights (linears/onednn.py) reads them at ~22-24 GB/s on a 2-core EPYC, while a
plain ``sum`` over the same tensors reads at ~33 GB/s with one thread: its kernel is bound
by its own instruction stream, not by memory. ``panel_gemm`` is the plain loop that memory
bound wants: the weight [N, K] packed once at load as [N/32, K, 32] (each 32-column panel
one contiguous stream), and for each panel and up to 8 rows at a time, 16 accumulators
(2 x 16 lanes x 8 rows) that take one FMA per loaded weight vector and row; panels split
across torch's OpenMP threads. The vector width follows the build: AVX-512 as above, AVX2
(a laptop's: 16 registers of 8 lanes) 3 rows x 4 vectors a call; a CPU with neither keeps
oneDNN. (Written once for 16-lane vectors only, the AVX2 build ran 8 rows in 378 ms against
oneDNN's 36: gcc split each vector through memory.)

Measured on a 2-core EPYC, SmolLM2-135M's 120 layer linears
(benchmarks/speed/linears_cpu.py, results/linears_cpu.md): 8 rows 19.8 -> 13.6 ms, 1 row
18.8 -> 13.6 ms, 16 rows 25.1 -> 19.3 ms, and no slower at 176 or 512 rows (prefill); the
engine's 8-row decode step went 44 -> 33 ms. On a 2-core Xeon: 8 rows 26.6 -> 21.0 ms, but
1024 rows (the CPU prefill chunk) 1.13-1.18x oneDNN's time and a whole 4k-token prefill
+6-9 %. It replaces oneDNN's weights all the same (a second copy would double the linears'
memory): an agent's turn spends most of its time in decode steps.

Each output is one row's dot product summed in the same order whatever else is in the
batch, so a row batched gives bit-for-bit what it gives alone; against the stock linear it
differs by fp32 rounding only. K is summed in blocks of 128 (each block's partial sum added to
the output): one long fp32 sum over K drifted 2-7x past MKL's own error at K = 576-4096 and moved
the embedded model's logprobs by 1.5e-4 between a decode and a prefill of the same tokens;
blocked, its error against an fp64 reference is below the stock linear's (tested), at the same
speed in decode and +1 % at 176 rows (measured on a 2-core Xeon). Each step also prefetches the
weight rows 16 steps (2 KB) ahead: on that Xeon the hardware prefetcher alone left the kernel no
faster than oneDNN from 8 rows up; with it, 8 rows 26.5 -> 20.4 ms (linears_cpu.md).

The kernel is C (``panel.c`` beside this file, shipped as package data), built at first use by
``build.py`` (``cc -O3 -march=native -fopenmp``, ~0.3 s) into the user's kernel cache and loaded
from there only through a checked fd (build.py), linked to the ``libgomp`` torch itself loads:
the same OpenMP runtime, so its threads are torch's team (a second runtime would oversubscribe
the cores, see onednn.py). With no compiler, no torch ``libgomp``, a failed build, an unsafe
cache folder or a failed self-check at load, ``panel_kernel()`` is None (logged once) and the
linears stay oneDNN's (``engine.cpu_linears: auto``; ``panel`` refuses to start instead).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch

from server.engines.hf.linears.build import FLAGS, build_library, load_library, torch_gomp

log = logging.getLogger(__name__)

PANEL = 32  # output columns per panel (2 AVX-512 vectors, 4 AVX2 vectors; 128 bytes a weight row)
SOURCE = Path(__file__).with_name("panel.c")

_lock = threading.Lock()
_loaded: list[Any] = []  # [the ctypes function] once built, [None] once it failed
_why: list[str] = []  # why it failed, for engine.cpu_linears: panel


def build_panel_kernel(flags: Sequence[str] = FLAGS) -> Any:
    """Build (or reuse) and load the kernel: its ctypes function, or raise why not."""
    gomp = torch_gomp()
    if gomp is None:
        raise RuntimeError("torch does not run on its own libgomp (OpenMP)")
    link = (f"-L{gomp.parent}", f"-l:{gomp.name}", f"-Wl,-rpath,{gomp.parent}")
    lib = load_library(build_library(SOURCE, flags, link))
    if lib.panel_gemm_isa() == 0:
        raise RuntimeError("this CPU has neither AVX-512 nor AVX2 with FMA, which the kernel is written for")
    fn = lib.panel_gemm
    fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long]
    fn.argtypes += [ctypes.c_void_p, ctypes.c_int]
    fn.restype = None
    return fn


def panel_kernel() -> Any:
    """The loaded, self-checked kernel of this process, or None (logged once; ``unavailable_reason``)."""
    with _lock:
        if not _loaded:
            try:
                fn = build_panel_kernel()
                check_kernel(fn)
                _loaded.append(fn)
            except Exception as exc:  # any failure: oneDNN's linears stay
                log.warning("panel_gemm kernel unavailable, keeping oneDNN linears: %s", exc)
                _loaded.append(None)
                _why.append(str(exc))
        return _loaded[0]


def unavailable_reason() -> str:
    """Why ``panel_kernel()`` is None ("" while it is not, or not asked yet)."""
    return _why[-1] if _why and _loaded and _loaded[0] is None else ""


def forget_kernel() -> None:
    """Build and check the kernel again at its next use (tests: another folder, compiler, ...)."""
    with _lock:
        _loaded.clear()
        _why.clear()


def check_kernel(fn: Any) -> None:
    """The kernel against ``F.linear`` on odd shapes (rows past 8, K not a multiple of 16)."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(2 * PANEL, 70, generator=gen)
    x = torch.randn(11, 70, generator=gen)
    # NaN first: an empty buffer can hold the right numbers from an earlier check (a CI run saw a
    # kernel that writes nothing pass), so only a kernel that writes every output can pass
    got = run(fn, x, pack(weight), 2 * PANEL, out=torch.full((11, 2 * PANEL), float("nan")))
    want = torch.nn.functional.linear(x, weight)
    if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
        raise RuntimeError(f"self-check failed (max error {float((got - want).abs().max()):.3g})")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] (N a multiple of 32) as panels [N / 32, K, 32]."""
    n, k = weight.shape
    return weight.detach().reshape(n // PANEL, PANEL, k).transpose(1, 2).contiguous()


def run(
    fn: Any, rows: torch.Tensor, panels: torch.Tensor, n: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``rows`` [M, K] times the packed weight: [M, n], into ``out`` if given (contiguous float32)."""
    if rows.dtype != torch.float32 or rows.device.type != "cpu":
        raise TypeError(f"panel_gemm takes CPU float32 rows, got {rows.dtype} on {rows.device}")
    rows = rows.contiguous()
    if out is None:
        out = rows.new_empty((rows.shape[0], n))
    fn(
        rows.data_ptr(),
        rows.shape[0],
        rows.shape[1],
        panels.data_ptr(),
        n,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return out


def panel_linear_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether linears on ``device`` / ``dtype`` can run on the kernel (CPU fp32, kernel built)."""
    return device.type == "cpu" and dtype == torch.float32 and panel_kernel() is not None


class PanelLinear(torch.nn.Module):
    """``linear`` on the packed kernel; same inputs and outputs as ``linear`` (out_features % 32 == 0).

    ``keep_weight`` keeps the plain weight as ``self.weight`` (the LM head: tied to the input
    embeddings, and the engine reads the vocabulary size from it); otherwise only the panels stay.
    ``kernel``: a kernel function of one's own (tests: another build); default ``panel_kernel()``.
    """

    def __init__(self, linear: torch.nn.Linear, keep_weight: bool = False, kernel: Any = None) -> None:
        super().__init__()
        assert linear.out_features % PANEL == 0
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        if keep_weight:
            self.weight = linear.weight
        self.bias = linear.bias
        self.kernel = kernel if kernel is not None else panel_kernel()
        with torch.no_grad():
            self.register_buffer("panels", pack(linear.weight), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        panels = cast(torch.Tensor, self.panels)
        out = run(self.kernel, rows, panels, self.out_features)
        if self.bias is not None:
            out.add_(self.bias)
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)
