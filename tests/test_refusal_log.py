"""Every 4xx of the worker in one log line with its reason (server/refusal_log.py via FrontDoor),
and the model's default logit_bias reaching the engine from each API (none of them sent one)."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from server.app import build_app
from server.config import load_settings
from server.refusal_log import MAX_MESSAGE, RefusalLog, reason_of
from tests.engines.fake import ScriptedEngine

MODEL = "smollm2-135m-instruct"
LOGGER = "server.refusal_log"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


@pytest.fixture
def engine(tokenizer):
    return ScriptedEngine(tokenizer, shipped=True)  # the embedded model's own tokenizer


def test_each_4xx_is_one_line_with_its_status_route_code_and_reason(engine, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    with TestClient(build_app(load_settings(device="cpu"), engine=engine)) as c:
        assert c.post("/v1/chat/completions", json={**CHAT, "logit_bias": {"x": 1}}).status_code == 400
        bad_messages = {
            "model": MODEL,
            "max_tokens": 4,
            "messages": [{"role": "assistant", "content": "x"}] * 0,
        }
        assert c.post("/v1/messages", json=bad_messages).status_code == 400  # Anthropic's error shape
        not_json = {"content-type": "application/json"}
        assert c.post("/v1/chat/completions", content=b"{not json", headers=not_json).status_code == 400
        assert c.get("/v1/responses/resp_missing").status_code == 404
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200  # not logged
    got = lines(caplog)
    assert len(got) == 4, got
    assert got[0].startswith(
        "4xx 400 POST /v1/chat/completions error=invalid_request_error param=logit_bias: logit_bias key 'x'"
    ), got
    assert got[1].startswith(
        "4xx 400 POST /v1/messages error=invalid_request_error: invalid request: messages"
    ), got
    assert got[2].startswith(
        "4xx 400 POST /v1/chat/completions error=invalid_request_error: the request body is not valid JSON"
    ), got
    assert got[3].startswith(
        "4xx 404 GET /v1/responses/{response_id} error=not_found: response 'resp_missing'"
    ), got
    assert all("\n" not in line for line in got)


def test_the_front_doors_own_refusals_are_logged_too(engine, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    settings = load_settings(device="cpu", auth={"api_keys": {"team-a": "sk-test-key-0123456789abcdef"}})
    with TestClient(build_app(settings, engine=engine)) as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 401
    (line,) = lines(caplog)
    assert line.startswith("4xx 401 POST /v1/chat/completions error=invalid_api_key: "), line


def test_lines_are_bounded_and_rate_limited(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    now = [0.0]
    refusals = RefusalLog(burst=3, period_s=10, clock=lambda: now[0])
    long = {"error": {"message": "bad\nthing " * 200, "code": "c" * 500, "param": None}}
    for _ in range(7):
        refusals.record(400, "POST", "/v1/chat/completions", long)
    assert len(lines(caplog)) == 3  # the burst; 4 counted
    now[0] = 10.0
    refusals.record(413, "POST", "/v1/messages", b"")
    got = lines(caplog)
    assert len(got) == 4 and got[-1].endswith("(4 more 4xx not logged: over 3 in 10 s)"), got[-1]
    assert "\n" not in got[0] and len(got[0].split(": ", 1)[1]) == MAX_MESSAGE, got[0]
    assert " error=" + "c" * 63 + "…: bad thing" in got[0]


def test_reasons_of_every_body_shape():
    assert reason_of({"error": {"message": "m", "code": "x", "param": "p"}}) == ("x", "p", "m")
    anthropic = b'{"type": "error", "error": {"type": "invalid_request_error", "message": "m"}}'
    assert reason_of(anthropic) == ("invalid_request_error", None, "m")
    assert reason_of(b'{"detail": "Not Found"}') == (None, None, "Not Found")
    assert reason_of(b"plain") == (None, None, "plain") and reason_of(b"") == (None, None, "(no body)")


def test_the_models_default_bias_reaches_the_engine_from_every_api(engine):
    """The embedded model's own default (configs/models/embedded.yaml: <|im_end|> +5) for a request
    that sends no logit_bias: chat, Messages and Responses alike; a chat request's own {} wins."""
    with TestClient(build_app(load_settings(device="cpu"), engine=engine)) as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert c.post("/v1/messages", json={**CHAT, "max_tokens": 4}).status_code == 200
        assert c.post("/v1/responses", json={"model": MODEL, "input": "hi"}).status_code == 200
        assert c.post("/v1/chat/completions", json={**CHAT, "logit_bias": {}}).status_code == 200
    assert [p.logit_bias for p in engine.checked] == [((2, 5.0),)] * 3 + [()]
