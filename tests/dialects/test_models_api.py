"""``GET /v1/models``: OpenAI's list as before; Anthropic's Models API shape when the request carries
``anthropic-version`` (issue 36 item 3), with the window as ``max_input_tokens``."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from server.app import build_app
from server.config import load_settings

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"


def test_models_in_both_shapes_and_one_by_name(hf_engine):
    settings = load_settings(device="cpu", served_model_aliases=["claude-x"], limits={"max_tokens": 4096})
    with TestClient(build_app(settings, engine=hf_engine)) as c:
        openai = c.get("/v1/models").json()
        assert openai["object"] == "list" and [m["id"] for m in openai["data"]] == [MODEL, "claude-x"]
        assert {m["max_model_len"] for m in openai["data"]} == {8192}
        headers = {"anthropic-version": "2023-06-01", "x-api-key": "any"}
        anthropic = c.get("/v1/models?limit=1000", headers=headers).json()
        assert anthropic["has_more"] is False and anthropic["first_id"] == MODEL
        assert anthropic["last_id"] == "claude-x"
        entry = anthropic["data"][0]
        assert entry["type"] == "model" and entry["id"] == MODEL and entry["display_name"] == MODEL
        assert entry["max_input_tokens"] == 8192 and entry["max_tokens"] == 4096
        assert c.get(f"/v1/models/{MODEL}", headers=headers).json() == entry
        assert c.get("/v1/models/claude-x").json()["root"] == MODEL
        missing = c.get("/v1/models/gpt-4o")
        assert missing.status_code == 404 and "GET /v1/models" in missing.json()["error"]["message"]
