"""The packed-panel linear kernel (linears/panel.py, panel.c): stock linear's outputs within fp32
rounding, a row batched bit-for-bit as alone, oneDNN kept when the kernel cannot be built or its
cache folder is not safe (linears/build.py), and the C source parses."""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import subprocess
import tomllib

import pytest
import torch

from server.engines.hf.linears import build, panel
from server.engines.hf.linears.install import install_linears
from server.engines.hf.linears.onednn import OneDNNLinear, onednn_linear_available
from server.engines.hf.linears.panel import PanelLinear, panel_linear_available

CPU = torch.device("cpu")
needs_kernel = pytest.mark.skipif(
    not panel_linear_available(CPU, torch.float32), reason="panel kernel not built (no cc / libgomp)"
)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16, 17, 176])
@pytest.mark.parametrize(("k", "n", "bias"), [(70, 64, False), (576, 960, True), (33, 32, True)])
def test_the_kernel_equals_the_stock_linear(rows, k, n, bias):
    gen = torch.Generator().manual_seed(rows * 1000 + k)
    linear = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=gen) * 0.05)
        x = torch.randn(rows, k, generator=gen)
        want = linear(x)
        got = PanelLinear(linear)(x)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("k", [576, 1536, 4096])
def test_the_kernel_is_no_less_accurate_than_the_stock_linear(k):
    """Against an fp64 reference: one long fp32 sum over K drifted 2-7x past MKL's error as K grew
    (and moved logprobs by 1.5e-4 between a decode and a prefill of the same tokens); summed in
    blocks it stays within the stock linear's own error."""
    gen = torch.Generator().manual_seed(k)
    linear = torch.nn.Linear(k, 256, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(256, k, generator=gen) * 0.05)
        x = torch.randn(16, k, generator=gen)
        exact = x.double() @ linear.weight.double().T
        stock_error = (linear(x).double() - exact).abs().max()
        panel_error = (PanelLinear(linear)(x).double() - exact).abs().max()
    assert panel_error <= stock_error


@needs_kernel
def test_a_row_batched_is_bit_for_bit_the_row_alone_and_3d_inputs_keep_their_shape():
    gen = torch.Generator().manual_seed(3)
    layer = PanelLinear(torch.nn.Linear(96, 128, bias=False))
    x = torch.randn(13, 96, generator=gen)
    with torch.no_grad():
        batched = layer(x)
        for i in range(13):
            assert torch.equal(layer(x[i : i + 1]), batched[i : i + 1])
        assert torch.equal(layer(x.view(1, 13, 96)), batched.view(1, 13, 128))
        with pytest.raises(TypeError, match="float32"):
            layer(x.double())


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
    """A process that has not built the kernel yet, its kernel folder under ``tmp_path``."""
    folder = tmp_path / "kernels"
    monkeypatch.setenv("AGENTSERVE_KERNEL_DIR", str(folder))
    panel.forget_kernel()
    yield folder
    panel.forget_kernel()  # the next test builds (or reuses) the kernel of the real folder


@pytest.mark.skipif(not onednn_linear_available(CPU, torch.float32), reason="torch without oneDNN's linear")
def test_without_a_compiler_the_engine_keeps_onednn_and_says_why(monkeypatch, tmp_path, caplog, fresh_kernel):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32))
    model.get_output_embeddings = lambda: None  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="server.engines.hf.linears.panel"):
        assert not panel_linear_available(CPU, torch.float32)
        assert install_linears(model, CPU, torch.float32) == 1
    assert isinstance(model[0], OneDNNLinear)
    assert "keeping oneDNN linears" in caplog.text and "no-such-cc" in caplog.text
    assert "no-such-cc" in panel.unavailable_reason()


def test_a_kernel_that_fails_its_self_check_is_not_used(monkeypatch, fresh_kernel):
    def wrong(x_ptr, m, k, w_ptr, n, y_ptr, threads):  # writes nothing: garbage outputs
        return None

    monkeypatch.setattr(panel, "build_panel_kernel", lambda: wrong)
    assert panel.panel_kernel() is None
    assert "self-check failed" in panel.unavailable_reason()


@needs_kernel
@pytest.mark.parametrize("victim", ["folder", "file"])
def test_a_kernel_folder_or_file_others_can_write_is_not_loaded(caplog, fresh_kernel, victim):
    """Loading the cached .so runs its code: a folder or file another user can write is refused."""
    folder = fresh_kernel
    assert panel.panel_kernel() is not None  # builds into the folder, mode 0700, file 0755
    assert folder.stat().st_mode & 0o777 == 0o700
    (built,) = folder.glob("panel-*.so")
    assert built.stat().st_mode & 0o022 == 0
    (folder if victim == "folder" else built).chmod(0o777)
    panel.forget_kernel()
    with caplog.at_level(logging.WARNING, logger="server.engines.hf.linears.panel"):
        assert panel.panel_kernel() is None
    assert "no one else can write" in caplog.text and "keeping oneDNN linears" in caplog.text


@needs_kernel
def test_a_link_where_the_kernel_was_is_not_followed(tmp_path, fresh_kernel):
    """The .so is opened without following links (and checked on what was opened): a link to a
    file elsewhere, swapped in after the build, is refused even though its target is ours."""
    assert panel.panel_kernel() is not None
    (built,) = fresh_kernel.glob("panel-*.so")
    elsewhere = tmp_path / "elsewhere.so"
    built.rename(elsewhere)
    built.symlink_to(elsewhere)
    with pytest.raises(build.UnsafeKernelPath, match="cannot be opened as a file"):
        build.load_library(built)
    panel.forget_kernel()
    assert panel.panel_kernel() is None and "cannot be opened as a file" in panel.unavailable_reason()


def test_every_folder_from_the_cache_root_down_is_checked_and_above_it_sticky_is_allowed(tmp_path):
    root = tmp_path / "cache"
    folder = root / "kernels"
    folder.mkdir(parents=True, mode=0o700)
    with build.open_private_folder(folder, root=root) as fd:  # ours, not writable by others
        assert os.fstat(fd).st_ino == folder.stat().st_ino
    root.chmod(0o777)  # the cache root writable by others: they could swap the kernels folder
    with pytest.raises(build.UnsafeKernelPath, match="every folder below it"):
        with build.open_private_folder(folder, root=root):
            pass
    root.chmod(0o700)
    tmp_path.chmod(0o1777)  # above the root: others may write a sticky folder (as /tmp) ...
    with build.open_private_folder(folder, root=root):
        pass
    tmp_path.chmod(0o777)  # ... but not a plain one
    try:
        with pytest.raises(build.UnsafeKernelPath, match="a folder above the cache"):
            with build.open_private_folder(folder, root=root):
                pass
    finally:
        tmp_path.chmod(0o700)


def test_a_link_in_the_folder_path_swapped_in_after_resolution_is_refused(tmp_path, monkeypatch):
    """The path is resolved once; every folder is then opened without following links: a folder
    replaced by a link between the two is refused, not followed."""
    real = tmp_path / "real"
    (real / "kernels").mkdir(parents=True, mode=0o700)
    swapped = tmp_path / "swapped"
    swapped.symlink_to(real)
    monkeypatch.setattr(build.os.path, "realpath", lambda p: str(p))  # as if it resolved before the swap
    with pytest.raises(build.UnsafeKernelPath, match="cannot be opened as a folder"):
        with build.open_private_folder(swapped / "kernels", root=tmp_path, create=False):
            pass


@needs_kernel
@pytest.mark.skipif(not {"avx2", "fma"} <= set(build.cpu_flags().split()), reason="CPU without AVX2 + FMA")
def test_the_avx2_build_of_a_laptop_equals_the_stock_linear_and_batched_is_alone(monkeypatch, tmp_path):
    """The kernel built for AVX2 (16 registers of 8 lanes: 3 rows a call) as on a laptop without
    AVX-512. Its 64-byte vectors written for AVX-512 compiled for AVX2 ran 8 rows 15x slower than
    oneDNN; the vector width now follows the build's ISA."""
    monkeypatch.setenv("AGENTSERVE_KERNEL_DIR", str(tmp_path))
    flags = tuple(f for f in build.FLAGS if f != "-march=native") + ("-march=haswell",)
    fn = panel.build_panel_kernel(flags)
    panel.check_kernel(fn)
    (built,) = tmp_path.glob("panel-*.so")
    assert ctypes.CDLL(str(built)).panel_gemm_isa() == 256  # 8-lane vectors, not 16-lane ones split
    gen = torch.Generator().manual_seed(7)
    linear = torch.nn.Linear(300, 96, bias=True)  # 3 panels, K past two sum blocks
    with torch.no_grad():
        layer = PanelLinear(linear, kernel=fn)
        x = torch.randn(17, 300, generator=gen)
        batched = layer(x)
        assert torch.allclose(batched, linear(x), atol=1e-4, rtol=1e-4)
        for i in range(17):
            assert torch.equal(layer(x[i : i + 1]), batched[i : i + 1])


@pytest.mark.skipif(build.compiler() is None, reason="no C compiler")
def test_the_kernel_source_parses():
    """CI's check of panel.c (package data): ``cc -fsyntax-only`` with the build's warnings as
    errors, for this machine and, on x86, for the AVX2 and AVX-512 builds."""
    cc = build.compiler()
    assert panel.SOURCE.is_file()
    marches = ["native"]
    if platform.machine() in ("x86_64", "AMD64"):
        marches += ["haswell", "skylake-avx512"]
    for march in marches:
        cmd = [cc, "-fsyntax-only", "-Wall", "-Werror", "-fopenmp", f"-march={march}", str(panel.SOURCE)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (march, done.stderr)


def test_the_kernel_source_ships_as_package_data():
    """An installed wheel has panel.c beside panel.py (setuptools ships only .py files unless told)."""
    pyproject = tomllib.loads((panel.SOURCE.parents[4] / "pyproject.toml").read_text())
    package_data = pyproject["tool"]["setuptools"]["package-data"]
    assert panel.SOURCE.name in package_data["server.engines.hf.linears"]


def test_a_kernel_that_writes_nothing_fails_its_self_check_even_right_after_a_good_one():
    """An output buffer left empty can hold the numbers a check just computed (freed and handed out
    again): a kernel that writes nothing then passed (a CI run). The check fills it with NaN first."""

    def right(x_ptr, m, k, w_ptr, n, y_ptr, threads):  # F.linear, through the kernel's pointers
        x = torch.frombuffer((ctypes.c_float * (m * k)).from_address(x_ptr), dtype=torch.float32)
        w = torch.frombuffer((ctypes.c_float * (n * k)).from_address(w_ptr), dtype=torch.float32)
        weight = w.reshape(n // panel.PANEL, k, panel.PANEL).transpose(1, 2).reshape(n, k)
        y = torch.nn.functional.linear(x.reshape(m, k), weight).contiguous()
        ctypes.memmove(y_ptr, y.data_ptr(), m * n * 4)

    def nothing(x_ptr, m, k, w_ptr, n, y_ptr, threads):
        return None

    for _ in range(3):
        panel.check_kernel(right)
        with pytest.raises(RuntimeError, match="self-check failed"):
            panel.check_kernel(nothing)
