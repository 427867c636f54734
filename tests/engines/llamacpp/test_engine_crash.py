"""A bug outside one batch kills the llamacpp engine thread: the requests it held end with an error at
once, /health names it, and a new request is a 503 ``engine_dead`` (before: they waited forever)."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="llama_cpp is not installed: run scripts/install_llamacpp.sh")

from server.config import load_settings  # noqa: E402
from server.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from server.errors import EngineDead  # noqa: E402
from server.families.model_facts import load_model_facts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_a_dead_engine_thread_fails_its_requests_and_refuses_new_ones(loop, embedded_model_dir):
    from server.engines.llamacpp.engine import LlamaCppEngine

    settings = load_settings(None, engine="llamacpp", model="embedded", max_model_len=1024, threads=1)
    engine = LlamaCppEngine(settings.engine_settings(), load_model_facts(settings, "llamacpp"))
    loop.run(engine.start())
    try:

        def broken(*args, **kwargs):
            raise RuntimeError("a bug in the slot table")

        engine.slots.claim = broken  # type: ignore[method-assign]
        request = GenerationRequest("r1", [1, 2, 3, 4], SamplingParams(max_tokens=8, temperature=0.0), None)

        async def collect():
            return [c async for c in engine.generate(request)]

        chunks = loop.run(collect())
        assert chunks[-1].finish_reason == "error" and "a bug in the slot table" in (chunks[-1].error or "")
        assert "decode thread has stopped" in (engine.health() or "")
        with pytest.raises(EngineDead):
            loop.run(collect())
    finally:
        loop.run(engine.shutdown())
