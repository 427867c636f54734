"""tests/clients: the `clients` marker (real client libraries in their own venvs); the embedded model
served as it ships (its own default logit_bias included, which the shared ``hf_engine`` leaves out)."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_configure(config):  # type: ignore[no-untyped-def]
    config.addinivalue_line("markers", "clients: a real client library in its venv (scripts/client_venvs.sh)")


@pytest.fixture(scope="session")
def shipped_engine(embedded_model_dir: Path):
    """An HFEngine on the embedded model with the facts a plain ``agentserve serve`` decides: the
    model's own default logit_bias (configs/models/embedded.yaml) included."""
    import asyncio

    from server.config import load_settings
    from server.engines.hf.engine import HFEngine
    from server.families.model_facts import load_model_facts

    settings = load_settings(device="cpu")
    engine = HFEngine(settings.engine_settings(), load_model_facts(settings, "hf"))
    assert engine.facts.default_logit_bias, "the embedded model ships an end-of-reply bias"
    yield engine
    asyncio.run(engine.shutdown())


@pytest.fixture(scope="session")
def shipped_server_url(shipped_engine):
    """``agentserve serve`` as shipped (default settings) on a free loopback port."""
    from server.app import build_app
    from server.config import load_settings
    from tests.conftest import running_server

    with running_server(build_app(load_settings(device="cpu"), engine=shipped_engine)) as url:
        yield url
