"""/health reports the engine's real state: on main it said ok with a dead engine. Liveness
(/health/live, restart me) fails only for a dead engine, never for load."""

from __future__ import annotations

import threading

import httpx
import pytest

from server.app import build_app
from server.config import LimitsSettings
from server.families.model_facts import load_model_facts
from tests.conftest import running_server, worker_settings

pytestmark = pytest.mark.e2e


def test_a_dead_engine_fails_health_and_liveness(embedded_model_dir):
    from server.engines.hf.engine import HFEngine

    engine = HFEngine(worker_settings().engine_settings(), load_model_facts(worker_settings(), "hf"))
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 400,
    }
    with running_server(build_app(worker_settings(), engine=engine)) as url:
        assert httpx.get(url + "/health", timeout=5).json()["status"] == "ok"
        assert httpx.get(url + "/health/live", timeout=5).status_code == 200

        def crash() -> None:  # a bug outside any one request's step: the decode thread dies
            raise RuntimeError("a bug in the scheduler")

        engine.scheduler.turn = crash  # type: ignore[method-assign]
        # the request it held ends at once with an error (on main it waited for the request timeout)
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code >= 500 and "a bug in the scheduler" in r.text, r.text
        r = httpx.get(url + "/health", timeout=5)
        assert r.status_code == 503 and r.json()["status"] == "engine_dead", r.text
        assert "decode thread" in r.json()["reason"] and "RuntimeError" in r.json()["reason"]
        assert httpx.get(url + "/health/live", timeout=5).status_code == 503
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)  # refused, not queued
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead", r.text


def test_an_overloaded_worker_stays_live_and_ready(hf_engine):
    limits = LimitsSettings(max_concurrent_requests=1, max_queued_requests=0)
    app = build_app(worker_settings().model_copy(update={"limits": limits}), engine=hf_engine)
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 30,
        "stream": True,
    }
    with running_server(app) as url:
        started = threading.Event()

        def hold() -> None:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
                for _ in r.iter_lines():
                    started.set()

        t = threading.Thread(target=hold)
        t.start()
        assert started.wait(60)
        busy = httpx.post(url + "/v1/chat/completions", json={**body, "stream": False}, timeout=30)
        assert busy.status_code == 429
        assert httpx.get(url + "/health/live", timeout=1).status_code == 200
        assert httpx.get(url + "/health", timeout=1).status_code == 200
        t.join(120)
