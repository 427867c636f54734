"""Which engine serves a model: a .gguf goes to llamacpp when llama_cpp is installed, unless set."""

from __future__ import annotations

import importlib.util

import pytest

from server import app
from server.config import load_settings


@pytest.fixture
def llama_cpp_installed(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        app.importlib.util, "find_spec", lambda name, *a: object() if name == "llama_cpp" else real(name, *a)
    )


def test_a_gguf_goes_to_llamacpp_when_it_is_installed(llama_cpp_installed):
    assert app.engine_kind(load_settings(None, model="/m/x.Q4_K_M.gguf")) == "llamacpp"


def test_an_engine_set_explicitly_wins(llama_cpp_installed):
    assert app.engine_kind(load_settings(None, model="/m/x.gguf", engine="hf")) == "hf"


def test_the_embedded_model_and_folders_stay_on_hf(llama_cpp_installed):
    assert app.engine_kind(load_settings(None)) == "hf"
    assert app.engine_kind(load_settings(None, model="/m/folder")) == "hf"


def test_without_llama_cpp_a_gguf_stays_on_hf(monkeypatch):
    monkeypatch.setattr(app.importlib.util, "find_spec", lambda name, *a: None)
    assert app.engine_kind(load_settings(None, model="/m/x.gguf")) == "hf"
