"""Issue 55 item 6: a client's retention hint is capped (``limits.max_retention_s``, default
``prefix_cache.session_cap_s``, 600 s, as docs/api.md promises) before any engine sees it: the vllm
session hold held a 7-day hint for 7 days. The response says what was asked and what holds."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from server.app import build_app
from server.config import load_settings
from tests.engines.fake import ScriptedEngine

MODEL = "smollm2-135m-instruct"
CHAT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
HOUR = {"type": "ephemeral", "ttl": "1h"}
HINTS = [
    ("/v1/chat/completions", {**CHAT, "cache_retention_s": 7 * 86400}, 7 * 86400.0),
    ("/v1/responses", {"model": MODEL, "input": "hi", "prompt_cache_retention": "24h"}, 86400.0),
    ("/v1/messages", {**CHAT, "system": [{"type": "text", "text": "s", "cache_control": HOUR}]}, 3600.0),
]


class Hinted(ScriptedEngine):
    def retention_hints(self) -> str | None:
        return None  # uses them (as the vllm session hold and the hf session policy do)


@pytest.mark.parametrize(("cap", "held"), [(None, 600.0), (30.0, 30.0)])
def test_every_hint_is_capped_before_the_engine(tokenizer, cap, held):
    engine = Hinted(tokenizer)
    settings = load_settings(device="cpu", limits={"max_retention_s": cap})
    with TestClient(build_app(settings, engine=engine)) as c:
        for path, body, asked in HINTS:
            r = c.post(path, json=body)
            assert r.status_code == 200, r.text
            assert engine.requests[-1].retain_s == held, path  # what the engine holds the session for
            assert r.json()["cache"]["retention_hint"] == {"requested_s": asked, "used": True, "held_s": held}
        r = c.post("/v1/chat/completions", json={**CHAT, "cache_retention_s": 20})
        assert engine.requests[-1].retain_s == 20.0  # under the cap: as asked
        assert r.json()["cache"]["retention_hint"] == {"requested_s": 20.0, "used": True}
