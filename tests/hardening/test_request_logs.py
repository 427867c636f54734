"""Issue 55 item 4: log lines a request derives are bounded (one summary line per request, values
cut, a global rate), and a dialect's conversion, work in the size of the body, runs off the event
loop. Before: one /v1/responses request with 100,000 hosted tools wrote 100,000 warning lines,
stalled /health for 1.06 s and was answered with 3.8 MiB."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from starlette.testclient import TestClient

from server.app import build_app
from server.config import load_settings
from server.log_budget import LogBudget, cut, tally
from tests.engines.fake import ScriptedEngine

MODEL = "smollm2-135m-instruct"
TOOLS_LOGGER = "server.dialects.responses.tools"


@pytest.fixture
def client(tokenizer):
    with TestClient(build_app(load_settings(device="cpu"), engine=ScriptedEngine(tokenizer))) as c:
        yield c


def test_a_flood_of_hosted_tools_is_refused_by_the_tool_limit(client, caplog):
    hosted = [{"type": "web_search"}] * 100_000
    messages = [{"role": "user", "content": "hi"}]
    with caplog.at_level(logging.INFO):
        t0 = time.monotonic()
        r = client.post("/v1/responses", json={"model": MODEL, "input": "hi", "tools": hosted})
        took = time.monotonic() - t0
        m = client.post(
            "/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": messages, "tools": hosted}
        )
    assert r.status_code == 400 and "limits.max_tools" in r.json()["error"]["message"], r.text[:300]
    assert len(r.content) < 1024 and took < 5
    assert m.status_code == 400 and "limits.max_tools" in m.json()["error"]["message"]
    assert len([rec for rec in caplog.records if rec.name.startswith("server.dialects")]) == 0


def test_dropped_tools_are_one_cut_line_per_request(client, caplog):
    long_kinds = [{"type": f"hosted_{i % 3}_" + "x" * 5000} for i in range(100)]
    with caplog.at_level(logging.WARNING, logger=TOOLS_LOGGER):
        r = client.post("/v1/responses", json={"model": MODEL, "input": "hi", "tools": long_kinds})
    assert r.status_code == 200, r.text[:300]
    lines = [rec.getMessage() for rec in caplog.records if rec.name == TOOLS_LOGGER]
    assert len(lines) == 1 and "dropped 100 hosted tool(s)" in lines[0], lines[:3]
    assert len(lines[0]) < 1000 and " x34" in lines[0]
    dropped = r.json()["agentserve"]["dropped_tools"]  # the echoed types are cut too
    assert len(dropped) == 100 and max(len(d["type"]) for d in dropped) < 100


def test_the_conversion_runs_off_the_event_loop(client, monkeypatch):
    import server.api.responses as responses

    seen: list[bool] = []
    convert = responses.to_chat

    def watched(*args, **kwargs):
        try:
            asyncio.get_running_loop()
            seen.append(True)  # on the event loop's thread
        except RuntimeError:
            seen.append(False)
        return convert(*args, **kwargs)

    monkeypatch.setattr(responses, "to_chat", watched)
    r = client.post("/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2})
    assert r.status_code == 200 and seen == [False]


def test_the_log_budget_caps_lines_per_second_and_says_what_it_dropped(caplog):
    now = [0.0]
    budget = LogBudget(per_second=10, burst=50, clock=lambda: now[0])
    log = logging.getLogger("tests.budget")
    with caplog.at_level(logging.INFO, logger="tests.budget"):
        written = sum(budget.log(log, logging.WARNING, "line %d", i) for i in range(1000))
        assert written == 50
        now[0] = 1.0
        written = sum(budget.log(log, logging.WARNING, "line %d", i) for i in range(1000))
        assert written == 10
    first_after = [r.getMessage() for r in caplog.records][50]
    assert "950 request log lines suppressed" in first_after


def test_values_are_cut_and_tallied():
    assert cut("x" * 10) == "x" * 10
    assert cut("x" * 100) == "x" * 64 + "… (100 characters)"
    assert tally(["a", "b", "a"] + [str(i) for i in range(20)]) == (
        "a x2, b x1, 0 x1, 1 x1, 2 x1, 3 x1, 4 x1, 5 x1, and 14 more"
    )
