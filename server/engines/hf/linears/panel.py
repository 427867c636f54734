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
(benchmarks/linears_cpu.py, results/linears_cpu.md): 8 rows 19.8 -> 13.6 ms, 1 row
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

The kernel is C compiled at first use (``cc -O3 -march=native -fopenmp``, ~0.3 s) into the
user's cache (``AGENTSERVE_KERNEL_DIR``, default ``kernels`` in the agentserve cache folder,
``AGENTSERVE_CACHE_DIR`` or ``~/.cache/agentserve``), keyed by
the source, the compiler flags, this CPU's flags and torch's lib folder, and linked to the
``libgomp`` torch itself loads: the same OpenMP runtime, so its threads are torch's team
(a second runtime would oversubscribe the cores, see onednn.py). With no compiler,
no torch ``libgomp``, a failed build or a failed self-check at load, the engine keeps
oneDNN's linears (logged once).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, cast

import torch

from server.model_store import cache_dir

log = logging.getLogger(__name__)

PANEL = 32  # output columns per panel (2 AVX-512 vectors, 4 AVX2 vectors; 128 bytes a weight row)
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")

SOURCE = r"""
#define PANEL 32
#define AHEAD 16 /* weight rows fetched ahead (2 KB): the prefetcher alone lagged at 8-16 rows */
#define KB 128 /* K summed in blocks: each block's sum added to y (fp32 error ~5x less than one long sum) */
#if defined(__AVX512F__)
#define VB 64 /* bytes a vector register holds */
#define ISA 512
#ifndef RMAX
#define RMAX 8 /* rows a kernel call: 8 x 2 accumulators of the 32 registers */
#endif
#else
#define VB 32
#if defined(__AVX2__) && defined(__FMA__)
#define ISA 256
#else
#define ISA 0
#endif
#ifndef RMAX
#define RMAX 3 /* 3 x 4 accumulators of the 16 registers */
#endif
#endif
#define LANES (VB / 4)
#define NV (PANEL / LANES) /* vectors in a panel's row */
typedef float vec __attribute__((vector_size(VB)));
static inline vec ld(const float* p) { vec v; __builtin_memcpy(&v, p, VB); return v; }
static inline void st(float* p, vec v) { __builtin_memcpy(p, &v, VB); }
/* rows m0..m0+MM of y[:, panel] = x[rows] @ W[panel]^T; P is the panel [K, 32] */
#define KERNEL(MM) \
static void k##MM(const float* x, long K, const float* P, float* y, long N) { \
  for (long k0 = 0; k0 < K; k0 += KB) { \
    long kend = k0 + KB < K ? k0 + KB : K; \
    vec a[MM][NV]; \
    for (int m = 0; m < MM; m++) for (int j = 0; j < NV; j++) a[m][j] = (vec){0}; \
    for (long k = k0; k < kend; k++) { \
      vec w[NV]; \
      for (int j = 0; j < NV; j++) w[j] = ld(P + k * PANEL + j * LANES); \
      __builtin_prefetch(P + (k + AHEAD) * PANEL); __builtin_prefetch(P + (k + AHEAD) * PANEL + 16); \
      for (int m = 0; m < MM; m++) { \
        float xv = x[m * K + k]; \
        for (int j = 0; j < NV; j++) a[m][j] += w[j] * xv; \
      } \
    } \
    for (int m = 0; m < MM; m++) for (int j = 0; j < NV; j++) { \
      float* yj = y + m * N + j * LANES; \
      if (k0) a[m][j] += ld(yj); \
      st(yj, a[m][j]); \
    } \
  } \
}
KERNEL(1) KERNEL(2) KERNEL(3) KERNEL(4) KERNEL(5) KERNEL(6) KERNEL(7) KERNEL(8)
typedef void (*kfn)(const float*, long, const float*, float*, long);
static const kfn KS[9] = {0, k1, k2, k3, k4, k5, k6, k7, k8};
/* the vector width this build runs on: 512 (AVX-512), 256 (AVX2 + FMA) or 0 (neither: not used) */
int panel_gemm_isa(void) { return ISA; }
/* y [M, N] = x [M, K] @ W^T, W packed as [N / 32, K, 32]; panels split across threads */
void panel_gemm(const float* x, long M, long K, const float* W, long N, float* y, int threads) {
  long NB = N / PANEL;
  #pragma omp parallel for schedule(static) num_threads(threads)
  for (long nb = 0; nb < NB; nb++) {
    const float* P = W + nb * K * PANEL;
    for (long m0 = 0; m0 < M; m0 += RMAX) {
      long mm = M - m0 < RMAX ? M - m0 : RMAX;
      KS[mm](x + m0 * K, K, P, y + m0 * N + nb * PANEL, N);
    }
  }
}
"""

_lock = threading.Lock()
_loaded: list[Any] = []  # [the ctypes function] once built, [None] once it failed


def _torch_gomp() -> Path | None:
    """The ``libgomp`` torch loads (its OpenMP runtime), if torch runs on OpenMP with its own copy."""
    lib = Path(torch.__file__).parent / "lib"
    found = sorted(lib.glob("libgomp*.so*"))
    return found[0] if found and "OpenMP" in torch.__config__.parallel_info() else None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _build(flags: tuple[str, ...] = FLAGS) -> Any:
    """Compile (or reuse) and load the kernel; the ctypes function, or raise why not."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    gomp = _torch_gomp()
    if cc is None:
        raise RuntimeError("no C compiler (cc / gcc) on PATH")
    if gomp is None:
        raise RuntimeError("torch does not run on its own libgomp (OpenMP)")
    key = hashlib.sha256("\0".join((SOURCE, cc, *flags, _cpu_flags(), str(gomp))).encode()).hexdigest()[:16]
    folder = Path(os.environ.get("AGENTSERVE_KERNEL_DIR") or cache_dir() / "kernels")
    target = folder / f"panel_gemm-{key}.so"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)  # its .so runs as our code: ours only
    _own_only(folder)
    if target.exists():
        _own_only(target)
    else:
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src, out = Path(tmp) / "panel_gemm.c", Path(tmp) / "panel_gemm.so"
            src.write_text(SOURCE)
            link = [f"-L{gomp.parent}", f"-l:{gomp.name}", f"-Wl,-rpath,{gomp.parent}"]
            done = subprocess.run(
                [cc, *flags, str(src), "-o", str(out), *link], capture_output=True, text=True, timeout=120
            )
            if done.returncode != 0:
                raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-500:]}")
            out.chmod(0o755)  # whatever the umask: a group-writable file would be refused next time
            os.replace(out, target)  # atomic: a worker beside this one sees all of it or nothing
    lib = ctypes.CDLL(str(target))
    if lib.panel_gemm_isa() == 0:
        raise RuntimeError("this CPU has neither AVX-512 nor AVX2 with FMA, which the kernel is written for")
    fn = lib.panel_gemm
    fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long]
    fn.argtypes += [ctypes.c_void_p, ctypes.c_int]
    fn.restype = None
    return fn


def _own_only(path: Path) -> None:
    """Refuse a kernel folder or file that another user owns or can write: loading it runs its code."""
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise RuntimeError(
            f"{path} is owned by uid {st.st_uid} with mode {st.st_mode & 0o777:o}: the kernel is only loaded "
            f"from a folder and file of this user's (uid {os.getuid()}) that no one else can write; "
            "fix its owner and mode (chmod go-w) or set AGENTSERVE_KERNEL_DIR to such a folder"
        )


def _kernel() -> Any:
    """The loaded, self-checked kernel, or None (logged once)."""
    with _lock:
        if not _loaded:
            try:
                fn = _build()
                _check(fn)
                _loaded.append(fn)
            except Exception as exc:  # any failure: oneDNN's linears stay
                log.warning("panel_gemm kernel unavailable, keeping oneDNN linears: %s", exc)
                _loaded.append(None)
        return _loaded[0]


def _check(fn: Any) -> None:
    """The kernel against ``F.linear`` on odd shapes (rows past 8, K not a multiple of 16)."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(2 * PANEL, 70, generator=gen)
    x = torch.randn(11, 70, generator=gen)
    got = _run(fn, x, pack(weight), 2 * PANEL)
    want = torch.nn.functional.linear(x, weight)
    if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
        raise RuntimeError(f"self-check failed (max error {float((got - want).abs().max()):.3g})")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] (N a multiple of 32) as panels [N / 32, K, 32]."""
    n, k = weight.shape
    return weight.detach().reshape(n // PANEL, PANEL, k).transpose(1, 2).contiguous()


def _run(fn: Any, rows: torch.Tensor, panels: torch.Tensor, n: int) -> torch.Tensor:
    if rows.dtype != torch.float32 or rows.device.type != "cpu":
        raise TypeError(f"panel_gemm takes CPU float32 rows, got {rows.dtype} on {rows.device}")
    rows = rows.contiguous()
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
    return device.type == "cpu" and dtype == torch.float32 and _kernel() is not None


class PanelLinear(torch.nn.Module):
    """``linear`` on the packed kernel; same inputs and outputs as ``linear`` (out_features % 32 == 0).

    ``keep_weight`` keeps the plain weight as ``self.weight`` (the LM head: tied to the input
    embeddings, and the engine reads the vocabulary size from it); otherwise only the panels stay.
    """

    def __init__(self, linear: torch.nn.Linear, keep_weight: bool = False) -> None:
        super().__init__()
        assert linear.out_features % PANEL == 0
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        if keep_weight:
            self.weight = linear.weight
        self.bias = linear.bias
        self._fn = _kernel()
        with torch.no_grad():
            self.register_buffer("panels", pack(linear.weight), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        panels = cast(torch.Tensor, self.panels)
        out = _run(self._fn, rows, panels, self.out_features)
        if self.bias is not None:
            out.add_(self.bias)
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)
