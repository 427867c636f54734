"""Shared fixtures: the embedded model folder and its tokenizer (converted once, cached)."""

from __future__ import annotations

import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hypothesis import settings as _hypothesis_settings  # noqa: E402

from server.ports import free_port, wait_for_health  # noqa: E402,F401  (free_port: for test modules)

# Property tests draw the same examples in every clone and on every run (CI must be
# deterministic): derandomize (examples derived from the test itself), no example database.
# HYPOTHESIS_PROFILE=explore draws new examples locally, to hunt for bugs.
_hypothesis_settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True)
_hypothesis_settings.register_profile("explore", derandomize=False)
_hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    from server.model_store import resolve_model

    return resolve_model("embedded", progress=True)


@pytest.fixture(scope="session")
def tokenizer(embedded_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir)


@functools.cache
def worker_settings():
    """The Settings of the shared test worker (the engine gets only its section of them).

    ``default_logit_bias: {}``: the shared engine serves the embedded model's own logits, without
    its shipped end-of-reply default (``configs/models/embedded.yaml``), which the e2e tests were
    written against (replies that run to ``max_tokens``). What ships is served by ``shipped_engine``
    (tests/clients/conftest.py) to the real-client tests, and checked in tests/test_model_defaults.py."""
    from server.config import load_settings

    return load_settings(device="cpu", default_logit_bias={})


@pytest.fixture(scope="session")
def hf_engine(embedded_model_dir: Path):
    """One HFEngine on the embedded model, shared by the e2e tests (loads in ~1 s once converted)."""
    import asyncio

    from server.engines.hf.engine import HFEngine
    from server.families.model_facts import load_model_facts

    engine = HFEngine(worker_settings().engine_settings(), load_model_facts(worker_settings(), "hf"))
    yield engine
    # stop the engine thread before the interpreter exits: a daemon thread still inside a torch op
    # at exit aborts the process ("terminate called without an active exception", exit 134)
    asyncio.run(engine.shutdown())


@contextmanager
def running_server(app, **options):
    """Serve an ASGI app with uvicorn on a free loopback port (in a thread); yields its URL.
    ``options``: more ``uvicorn.Config`` settings (e.g. ``server.ws_gate.uvicorn_ws_options``)."""
    import threading

    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, 60, ok=(200, 401))
    except TimeoutError:
        raise RuntimeError("test server did not start") from None
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture(scope="session")
def server_url(hf_engine):
    """A real uvicorn server on a free loopback port, serving the shared engine."""
    from server.app import build_app

    with running_server(build_app(worker_settings(), engine=hf_engine)) as url:
        yield url


@pytest.fixture(scope="session")
def client(server_url):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server_url + "/v1", api_key="test", max_retries=0, timeout=120)
