"""A streaming client that disconnects cancels its engine request, in every dialect (issue 36 item 5):
chat SSE, Responses SSE, Messages SSE here (a real uvicorn server: a disconnect is a closed TCP
connection), the Responses WebSocket in tests/dialects/test_responses_ws_interrupt.py. Both while
the engine decodes and while it prefills (nothing sent yet)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from server.app import build_app
from tests.conftest import running_server, worker_settings
from tests.hardening.slow_engine import SlowEngine

MODEL = "smollm2-135m-instruct"
USER = "Write a long story."
DIALECTS: dict[str, tuple[str, dict[str, Any], str]] = {
    # path, body, a line that shows decoding has begun
    "chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": USER}], "max_tokens": 500},
        '"content":"',
    ),
    "responses": ("/v1/responses", {"input": USER, "max_output_tokens": 500}, "response.output_text.delta"),
    "messages": (
        "/v1/messages",
        {"messages": [{"role": "user", "content": USER}], "max_tokens": 500},
        "text_delta",
    ),
}


@pytest.fixture(scope="module")
def served(tokenizer):
    engine = SlowEngine(tokenizer, step_s=0.02)
    with running_server(build_app(worker_settings(), engine=engine)) as url:
        yield url, engine


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize("phase", ["decoding", "prefilling"])
def test_a_client_that_disconnects_cancels_its_engine_request(served, dialect, phase):
    url, engine = served
    path, body, decoding = DIALECTS[dialect]
    engine.prefill_s = 30.0 if phase == "prefilling" else 0.0
    index = len(engine.runs)
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", url + path, json={"model": MODEL, "stream": True, **body}) as r:
            assert r.status_code == 200
            if phase == "decoding":
                next(line for line in r.iter_lines() if decoding in line)
            else:
                deadline = time.monotonic() + 10
                while len(engine.runs) <= index:  # the engine has the request (prefilling)
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
            left_at = time.monotonic()
    run = engine.wait_closed(index)
    assert not run.finished and run.closed_at is not None
    assert run.closed_at - left_at < 1.0, (dialect, phase, run.closed_at - left_at)
