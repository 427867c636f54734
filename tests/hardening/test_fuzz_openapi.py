"""schemathesis over the served OpenAPI schema: no 5xx, every error OpenAI-shaped."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

from server.app import build_app  # noqa: E402
from server.config import load_settings  # noqa: E402
from tests.conftest import worker_settings  # noqa: E402

pytestmark = pytest.mark.e2e

# The schema only (no engine is loaded for it); the cases run against fuzz_app below.
schema = schemathesis.openapi.from_asgi("/openapi.json", build_app(load_settings()))


@pytest.fixture(scope="module")
def fuzz_app(hf_engine):
    """An app on the session's shared engine; TestClient runs its lifespan (service wiring)."""
    from fastapi.testclient import TestClient

    app = build_app(worker_settings().model_copy(update={"default_max_tokens": 2}), engine=hf_engine)
    with TestClient(app):
        yield app


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_and_openai_errors(case, fuzz_app):
    if case.body is not None and isinstance(case.body, dict):
        case.body["max_tokens"] = 2  # keep generation short when a body happens to be valid
        case.body.pop("max_completion_tokens", None)
    response = case.call(app=fuzz_app)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        err = response.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert err["type"] in {"invalid_request_error", "authentication_error", "rate_limit_error"}
