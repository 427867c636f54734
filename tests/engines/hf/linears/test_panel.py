"""The packed-panel linear kernel (panel_gemm.py): stock linear's outputs within fp32 rounding,
a row batched bit-for-bit as alone, and oneDNN kept when the kernel cannot be built."""

from __future__ import annotations

import ctypes
import logging

import pytest
import torch

from server.engines.hf.linears import panel as panel_gemm
from server.engines.hf.linears.onednn import OneDNNLinear, onednn_linear_available, use_onednn_linears
from server.engines.hf.linears.panel import PanelLinear, panel_linear_available

CPU = torch.device("cpu")
needs_kernel = pytest.mark.skipif(
    not panel_linear_available(CPU, torch.float32), reason="panel_gemm kernel not built (no cc / libgomp)"
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


@pytest.mark.skipif(not onednn_linear_available(CPU, torch.float32), reason="torch without oneDNN's linear")
def test_without_a_compiler_the_engine_keeps_onednn_and_says_why(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(panel_gemm, "_loaded", [])  # not built yet in this "process"
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("AGENTSERVE_KERNEL_DIR", str(tmp_path / "kernels"))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32))
    model.get_output_embeddings = lambda: None  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="server.engines.hf.linears.panel"):
        assert not panel_linear_available(CPU, torch.float32)
        assert use_onednn_linears(model, CPU, torch.float32) == 1
    assert isinstance(model[0], OneDNNLinear)
    assert "keeping oneDNN linears" in caplog.text and "no-such-cc" in caplog.text


def test_a_kernel_that_fails_its_self_check_is_not_used(monkeypatch):
    monkeypatch.setattr(panel_gemm, "_loaded", [])

    def wrong(x_ptr, m, k, w_ptr, n, y_ptr, threads):  # writes nothing: garbage outputs
        return None

    monkeypatch.setattr(panel_gemm, "_build", lambda: wrong)
    assert panel_gemm._kernel() is None


@needs_kernel
@pytest.mark.parametrize("victim", ["folder", "file"])
def test_a_kernel_folder_or_file_others_can_write_is_not_loaded(monkeypatch, tmp_path, caplog, victim):
    """Loading the cached .so runs its code: a folder or file another user can write is refused."""
    folder = tmp_path / "kernels"
    monkeypatch.setenv("AGENTSERVE_KERNEL_DIR", str(folder))
    monkeypatch.setattr(panel_gemm, "_loaded", [])
    assert panel_gemm._kernel() is not None  # builds into the folder, mode 0700, file 0755
    assert folder.stat().st_mode & 0o777 == 0o700
    (built,) = folder.glob("panel_gemm-*.so")
    assert built.stat().st_mode & 0o022 == 0
    (folder if victim == "folder" else built).chmod(0o777)
    monkeypatch.setattr(panel_gemm, "_loaded", [])
    with caplog.at_level(logging.WARNING, logger="server.engines.hf.linears.panel"):
        assert panel_gemm._kernel() is None
    assert "no one else can write" in caplog.text and "keeping oneDNN linears" in caplog.text


@needs_kernel
@pytest.mark.skipif(
    not {"avx2", "fma"} <= set(panel_gemm._cpu_flags().split()), reason="CPU without AVX2 + FMA"
)
def test_the_avx2_build_of_a_laptop_equals_the_stock_linear_and_batched_is_alone(monkeypatch, tmp_path):
    """The kernel built for AVX2 (16 registers of 8 lanes: 3 rows a call) as on a laptop without
    AVX-512. Its 64-byte vectors written for AVX-512 compiled for AVX2 ran 8 rows 15x slower than
    oneDNN; the vector width now follows the build's ISA."""
    monkeypatch.setenv("AGENTSERVE_KERNEL_DIR", str(tmp_path))
    flags = tuple(f for f in panel_gemm.FLAGS if f != "-march=native") + ("-march=haswell",)
    fn = panel_gemm._build(flags)
    panel_gemm._check(fn)
    (built,) = tmp_path.glob("panel_gemm-*.so")
    assert ctypes.CDLL(str(built)).panel_gemm_isa() == 256  # 8-lane vectors, not 16-lane ones split
    gen = torch.Generator().manual_seed(7)
    linear = torch.nn.Linear(300, 96, bias=True)  # 3 panels, K past two sum blocks
    with torch.no_grad():
        layer = PanelLinear(linear)
        layer._fn = fn
        x = torch.randn(17, 300, generator=gen)
        batched = layer(x)
        assert torch.allclose(batched, linear(x), atol=1e-4, rtol=1e-4)
        for i in range(17):
            assert torch.equal(layer(x[i : i + 1]), batched[i : i + 1])
