"""tests/engines/llamacpp: need llama_cpp (scripts/install_llamacpp.sh builds and caches it); every
module that loads it starts with ``pytest.importorskip("llama_cpp")``. ``loop``: an event loop in a
thread (the vllm tests' helper) for the engine's coroutines."""

from __future__ import annotations

import pytest

from tests.engines.vllm.conftest import Loop


@pytest.fixture(scope="module")
def loop():
    lp = Loop()
    yield lp
    lp.close()
