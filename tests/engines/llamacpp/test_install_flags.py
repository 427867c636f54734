"""scripts/install_llamacpp.sh picks ggml's vector extensions from the CPU's flags (--print-args):
a wheel built with an extension the CPU lacks dies with SIGILL at the first matmul, and one built
without what the CPU has runs prefill slower (AVX-512: 1.56x on the 1B Q4_K_M)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "install_llamacpp.sh"

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the flag logic is x86-64's")

BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi2"
AVX512 = "avx512f avx512dq avx512cd avx512bw avx512vl"


def print_args(tmp_path: Path, flags: str, **env: str) -> tuple[list[str], str]:
    """The script's cmake flags and cache key for a CPU whose /proc/cpuinfo lists ``flags``."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    outer = {k: v for k, v in os.environ.items() if k != "LLAMACPP_CMAKE_ARGS"}  # the CPU decides
    run_env = {**outer, "AGENTSERVE_CPUINFO": str(cpuinfo), **env}
    out = subprocess.run(
        ["bash", str(SCRIPT), "--print-args"], env=run_env, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    return out[0].split(), out[1]


def test_an_avx2_cpu_gets_no_avx512(tmp_path):
    args, _ = print_args(tmp_path, BASE)
    assert "-DGGML_AVX2=ON" in args and "-DGGML_FMA=ON" in args
    assert not [a for a in args if "AVX512" in a or "VNNI" in a]


def test_avx512_needs_every_base_subset(tmp_path):
    """AVX512F alone (Knights Landing has no BW/VL) is not enough for ggml's AVX-512 kernels."""
    args, _ = print_args(tmp_path, f"{BASE} avx512f avx512cd")
    assert "-DGGML_AVX512=ON" not in args
    args, _ = print_args(tmp_path, f"{BASE} {AVX512}")
    assert "-DGGML_AVX512=ON" in args
    assert not [a for a in args if "VNNI" in a or "BF16" in a or "VBMI" in a]


def test_each_extension_follows_its_own_flag(tmp_path):
    args, _ = print_args(tmp_path, f"{BASE} {AVX512} avx512_vnni avx_vnni")
    assert {"-DGGML_AVX512_VNNI=ON", "-DGGML_AVX_VNNI=ON"} <= set(args)
    assert "-DGGML_AVX512_BF16=ON" not in args and "-DGGML_AVX512_VBMI=ON" not in args
    args, _ = print_args(tmp_path, f"{BASE} {AVX512} avx512vbmi avx512_bf16")
    assert {"-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_BF16=ON"} <= set(args)
    assert "-DGGML_AVX512_VNNI=ON" not in args
    # a flag is a whole word: avx512_vnni does not switch on the AVX-VNNI (256-bit) build
    args, _ = print_args(tmp_path, f"{BASE} {AVX512} avx512_vnni")
    assert "-DGGML_AVX_VNNI=ON" not in args


def test_the_flags_are_the_wheel_cache_key(tmp_path):
    """Two kinds of CPU reading one cache get a wheel each; the same CPU finds its own again."""
    _, avx2 = print_args(tmp_path, BASE)
    _, avx512 = print_args(tmp_path, f"{BASE} {AVX512}")
    _, again = print_args(tmp_path, BASE)
    assert avx2 != avx512 and avx2 == again


def test_cmake_args_from_the_environment_replace_the_detected_ones(tmp_path):
    args, key = print_args(tmp_path, f"{BASE} {AVX512}", LLAMACPP_CMAKE_ARGS="-DGGML_NATIVE=ON")
    assert args[0] == "-DGGML_NATIVE=ON" and "-DGGML_AVX512=ON" not in args
    assert "-DLLAMA_BUILD_TESTS=OFF" in args  # the script's own switches stay
    assert key != print_args(tmp_path, f"{BASE} {AVX512}")[1]
