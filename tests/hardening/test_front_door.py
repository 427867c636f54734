"""Auth, tenant cache isolation, limits, disconnects and timeouts, through real HTTP."""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import pytest

from server.app import build_app
from server.config import AuthSettings, LimitsSettings
from tests.conftest import running_server, worker_settings

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
KEYS = {"team-a": "sk-a-123", "team-b": "sk-b-456"}


def app_with(hf_engine, **update):
    return build_app(worker_settings().model_copy(update=update), engine=hf_engine)


def chat(url, key=None, timeout=120, **body):
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0, **body}
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=timeout)


@pytest.fixture(scope="module")
def keyed_url(hf_engine):
    with running_server(app_with(hf_engine, auth=AuthSettings(api_keys=KEYS))) as url:
        yield url


def test_api_keys(keyed_url):
    for key, needle in ((None, "missing API key"), ("sk-wrong", "invalid API key")):
        r = chat(keyed_url, key)
        assert r.status_code == 401 and needle in r.json()["error"]["message"]
        assert r.json()["error"]["type"] == "authentication_error"
    assert chat(keyed_url, "sk-a-123").status_code == 200
    assert httpx.get(keyed_url + "/health").status_code == 200  # always open
    assert httpx.get(keyed_url + "/metrics").status_code == 200  # open unless protect_metrics
    r = httpx.get(keyed_url + "/v1/models", headers={"Authorization": "Bearer sk-b-456"})
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("path", "body"), [("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})]
)
def test_tokenize_endpoints_are_keyed(keyed_url, path, body):
    for key in (None, "sk-wrong"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = httpx.post(keyed_url + path, json=body, headers=headers, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(keyed_url + path, json=body, headers={"Authorization": "Bearer sk-a-123"}, timeout=30)
    assert r.status_code == 200


def test_metrics_can_be_protected(hf_engine):
    auth = AuthSettings(api_keys=KEYS, protect_metrics=True)
    with running_server(app_with(hf_engine, auth=auth)) as url:
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/metrics", headers={"Authorization": "Bearer sk-a-123"}).status_code == 200


def test_tenants_never_share_cached_prefixes(keyed_url):
    secret = "Internal runbook of team A: " + "rotate the keys every Monday. " * 40
    msgs = [{"role": "system", "content": secret}, {"role": "user", "content": "summarize"}]
    a1 = chat(keyed_url, "sk-a-123", messages=msgs, prompt_cache_key="s").json()
    b1 = chat(keyed_url, "sk-b-456", messages=msgs, prompt_cache_key="s").json()
    a2 = chat(keyed_url, "sk-a-123", messages=msgs, prompt_cache_key="s").json()
    assert a1["usage"]["prompt_tokens"] > 200
    assert b1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert b1["cache"]["diverged_at_token"] is None  # B's session table never saw A's prompt
    assert a2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0.9 * a1["usage"]["prompt_tokens"]


def test_sharing_can_be_allowed(hf_engine):
    auth = AuthSettings(api_keys=KEYS, share_prefix_cache=True)
    with running_server(app_with(hf_engine, auth=auth)) as url:
        msgs = [{"role": "system", "content": "Shared handbook. " * 60}, {"role": "user", "content": "q"}]
        chat(url, "sk-a-123", messages=msgs)
        b = chat(url, "sk-b-456", messages=msgs).json()
        assert b["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


@pytest.fixture(scope="module")
def limited_url(hf_engine):
    limits = LimitsSettings(
        max_request_bytes=4096,
        max_tools=2,
        max_tool_schema_bytes=300,
        max_tokens=50,
        max_concurrent_requests=1,
        max_queued_requests=0,
        request_timeout_s=3,
    )
    with running_server(app_with(hf_engine, limits=limits)) as url:
        yield url


def tool(name, n_props=1):
    props = {f"p{i}": {"type": "string"} for i in range(n_props)}
    params = {"type": "object", "properties": props}
    return {"type": "function", "function": {"name": name, "parameters": params}}


@pytest.mark.parametrize(
    "body, status, needle",
    [
        ({"messages": [{"role": "user", "content": "x" * 5000}]}, 413, "limits.max_request_bytes"),
        ({"tools": [tool("a"), tool("b"), tool("c")]}, 400, "limits.max_tools"),
        ({"tools": [tool("a", 20)]}, 400, "limits.max_tool_schema_bytes"),
        ({"max_tokens": 51}, 400, "limits.max_tokens"),
    ],
)
def test_each_limit_names_itself(limited_url, body, status, needle):
    r = chat(limited_url, **body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


def _stream_lines(url, body, until=None):
    lines = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line:
                lines.append(line)
            if until is not None and len(lines) >= until:
                break
    return lines


def test_queue_full_is_429_with_retry_after(limited_url):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 40,
        "stream": True,
        "temperature": 0,
    }
    started = threading.Event()

    def hold():
        with httpx.stream("POST", limited_url + "/v1/chat/completions", json=body, timeout=60) as r:
            for _ in r.iter_lines():
                started.set()

    t = threading.Thread(target=hold)
    t.start()
    assert started.wait(30)
    r = chat(limited_url)
    t.join(60)
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    assert "limits.max_concurrent_requests" in r.json()["error"]["message"]
    assert chat(limited_url).status_code == 200  # the slot came back


def test_timeout_ends_the_request_with_an_error(hf_engine):
    limits = LimitsSettings(request_timeout_s=1.0)
    with running_server(app_with(hf_engine, limits=limits)) as url:
        msgs = [{"role": "user", "content": "Write a very long essay about the ocean."}]
        r = chat(url, messages=msgs, max_tokens=400)
        assert r.status_code == 504 and "limits.request_timeout_s" in r.json()["error"]["message"]
        lines = _stream_lines(url, {"model": MODEL, "messages": msgs, "max_tokens": 400, "stream": True})
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["error"]["code"] == "timeout"
        time.sleep(0.5)
        assert hf_engine.stats().running == 0


def test_disconnect_mid_stream_stops_generation(server_url, hf_engine):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count to one thousand."}],
        "max_tokens": 500,
        "stream": True,
        "temperature": 0,
    }
    before = hf_engine.tokens_generated
    _stream_lines(server_url, body, until=4)  # read a few chunks, then hang up
    deadline = time.monotonic() + 10
    while hf_engine.stats().running and time.monotonic() < deadline:
        time.sleep(0.05)
    stopped_at = hf_engine.tokens_generated
    time.sleep(1.0)
    assert hf_engine.stats().running == 0
    assert hf_engine.tokens_generated == stopped_at  # nothing more was generated
    assert stopped_at - before < 40  # far fewer than max_tokens


def test_no_prompt_text_in_logs(server_url, caplog):
    caplog.set_level(logging.DEBUG)
    secret = "the launch code is 0000-SECRET"
    assert chat(server_url, messages=[{"role": "user", "content": secret}]).status_code == 200
    assert "SECRET" not in caplog.text


def test_the_front_door_counts_refusals_and_leaves_streams_unrelayed(keyed_url, hf_engine):
    from starlette.middleware.base import BaseHTTPMiddleware

    assert chat(keyed_url, None).status_code == 401
    text = httpx.get(keyed_url + "/metrics").text
    assert 'agentserve_requests_total{endpoint="/v1/chat/completions",status="401"}' in text
    # no BaseHTTPMiddleware: it would pass every token of every stream through a task of its own
    app = app_with(hf_engine)
    assert not [m for m in app.user_middleware if issubclass(m.cls, BaseHTTPMiddleware)]
