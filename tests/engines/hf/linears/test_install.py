"""engine.cpu_linears: which kernel runs the linears (auto, panel, onednn), and a panel demand
the machine cannot meet stops the engine's start instead of running oneDNN under its name."""

from __future__ import annotations

import asyncio

import pytest
import torch

from server.config import ConfigError, load_settings
from server.engines.hf.engine import HFEngine
from server.engines.hf.linears import panel
from server.engines.hf.linears.install import install_linears
from server.engines.hf.linears.onednn import OneDNNLinear, onednn_linear_available
from server.engines.hf.linears.panel import PanelLinear, panel_linear_available
from server.families.model_facts import facts_of_model
from tests.engines.hf.tiny_models import tiny

CPU = torch.device("cpu")
needs_onednn = pytest.mark.skipif(
    not onednn_linear_available(CPU, torch.float32), reason="torch built without oneDNN's linear"
)


def _mlp() -> torch.nn.Sequential:
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Linear(64, 20))  # 64 fills panels
    model.get_output_embeddings = lambda: None  # type: ignore[method-assign]
    return model


@pytest.fixture
def no_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("AGENTSERVE_KERNEL_DIR", str(tmp_path / "kernels"))
    panel.forget_kernel()
    yield
    panel.forget_kernel()


@needs_onednn
def test_onednn_runs_every_layer_on_onednn_even_where_panels_fit():
    model = _mlp()
    assert install_linears(model, CPU, torch.float32, "onednn") == 2
    assert all(isinstance(m, OneDNNLinear) for m in model)


@needs_onednn
@pytest.mark.skipif(not panel_linear_available(CPU, torch.float32), reason="panel kernel not built")
@pytest.mark.parametrize("choice", ["auto", "panel"])
def test_auto_and_panel_run_the_kernel_where_the_outputs_fill_panels(choice):
    model = _mlp()
    assert install_linears(model, CPU, torch.float32, choice) == 2
    assert isinstance(model[0], PanelLinear) and isinstance(model[1], OneDNNLinear)  # 20 outputs: no panel


@needs_onednn
def test_panel_without_the_kernel_refuses_and_names_why_while_auto_falls_back(no_compiler):
    with pytest.raises(RuntimeError, match="cpu_linears is 'panel'.*no-such-cc"):
        install_linears(_mlp(), CPU, torch.float32, "panel")
    model = _mlp()
    assert install_linears(model, CPU, torch.float32, "auto") == 2
    assert all(isinstance(m, OneDNNLinear) for m in model)


def test_other_devices_and_dtypes_keep_torchs_linears_and_a_bad_choice_is_an_error():
    model = _mlp()
    assert install_linears(model, CPU, torch.bfloat16, "panel") == 0
    assert install_linears(model, torch.device("cuda"), torch.float32, "onednn") == 0
    assert all(type(m) is torch.nn.Linear for m in model)
    with pytest.raises(ValueError, match="auto, panel or onednn"):
        install_linears(model, CPU, torch.float32, "mkl")  # type: ignore[arg-type]


def test_the_setting_reaches_the_engine_and_is_checked():
    assert load_settings().engine_settings().cpu_linears == "auto"
    assert load_settings(cpu_linears="onednn").engine_settings().cpu_linears == "onednn"
    with pytest.raises(ConfigError, match="cpu_linears"):
        load_settings(cpu_linears="mkl")


@needs_onednn
def test_an_engine_asked_for_panels_without_the_kernel_does_not_start(no_compiler):
    settings, model = load_settings(device="cpu", cpu_linears="panel"), tiny("llama")
    engine = HFEngine(settings, facts_of_model(settings, None, model), model=model)
    with pytest.raises(RuntimeError, match="hf engine could not start.*cpu_linears is 'panel'"):
        asyncio.run(engine.start())
    assert engine.health() is None  # not serving: no thread claims to be alive


@needs_onednn
def test_an_engine_asked_for_onednn_runs_every_linear_on_onednn():
    settings, model = load_settings(device="cpu", cpu_linears="onednn"), tiny("llama")
    engine = HFEngine(settings, facts_of_model(settings, None, model), model=model)
    try:
        asyncio.run(engine.start())
        linears = [m for m in engine.model.modules() if isinstance(m, (OneDNNLinear, PanelLinear))]
        assert linears and all(isinstance(m, OneDNNLinear) for m in linears)
    finally:
        asyncio.run(engine.shutdown())
