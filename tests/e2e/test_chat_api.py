"""End to end with the official openai client on the embedded model."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import worker_settings

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
SYSTEM = "You are a careful coding agent. " + " ".join(f"Rule {i}: check your work." for i in range(60))


def ask(client, messages, key, **kw):
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(
        model=MODEL, messages=messages, extra_body={"prompt_cache_key": key, **kw.pop("extra_body", {})}, **kw
    )


def test_second_turn_is_served_from_cache(client):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is in README.md?"}]
    r1 = ask(client, msgs, "e2e-two-turns")
    msgs += [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "More."},
    ]
    r2 = ask(client, msgs, "e2e-two-turns")
    assert r2.usage.prompt_tokens > r1.usage.prompt_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens >= 0.9 * r1.usage.prompt_tokens
    cache = r2.model_extra["cache"]
    assert cache["cached_tokens"] == r2.usage.prompt_tokens_details.cached_tokens
    assert cache["diverged_at_token"] is None and cache["session_key_source"] == "prompt_cache_key"


def test_changed_system_prompt_reports_where_it_diverged(client, tokenizer):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]
    ask(client, msgs, "e2e-diverge")
    changed = SYSTEM.replace("Rule 30:", "Rule 30 (2026-11-22 10:00):")
    r = ask(client, [{"role": "system", "content": changed}, msgs[1]], "e2e-diverge")
    cache = r.model_extra["cache"]
    # the expected token: where the two rendered prompts' token ids first differ
    head = "<|im_start|>system\n"
    a = tokenizer(head + SYSTEM, add_special_tokens=False)["input_ids"]
    b = tokenizer(head + changed, add_special_tokens=False)["input_ids"]
    expected = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert cache["diverged_at_token"] == expected
    assert "system message changed at character" in cache["reason"]
    assert "2026-11-22" in cache["reason"]
    # the blocks before the change still came from cache
    assert (expected // 32) * 32 - 32 <= r.usage.prompt_tokens_details.cached_tokens <= expected


def test_streaming_matches_non_streaming_at_temperature_zero(client):
    msgs = [{"role": "user", "content": "Write one sentence about the sea."}]
    full = ask(client, msgs, "e2e-stream", max_tokens=24)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"prompt_cache_key": "e2e-stream"},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content and text
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens > 0  # same prompt again
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason


def test_stop_string_cuts_the_text(client):
    msgs = [{"role": "user", "content": "Count from 1 to 20 separated by commas."}]
    full = ask(client, msgs, "e2e-stop", max_tokens=30).choices[0].message.content
    assert len(full) > 8
    stop = full[len(full) // 2 : len(full) // 2 + 3]  # a string the model is known to write (temperature 0)
    cut = ask(client, msgs, "e2e-stop", max_tokens=30, stop=["@@never@@", stop])
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].model_extra["stop_reason"] == stop  # vLLM's field: which stop string ended it


def test_completions_endpoint(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert r.choices[0].text and r.usage.prompt_tokens == 5
    # 5 tokens never fill a cache block (and the last token is always computed): nothing cached,
    # reported in OpenAI's field and in the cache extension alike
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    assert r.model_extra["cache"]["cached_tokens"] == 0 and r.model_extra["cache"]["prompt_tokens"] == 5


def test_models_health_metrics(server_url, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server_url + "/health").json()["status"] == "ok"
    text = httpx.get(server_url + "/metrics").text
    for name in (
        "agentserve_prefix_cache_queries_tokens_total",
        "agentserve_prefix_cache_hits_tokens_total",
        "agentserve_time_to_first_token_seconds_bucket",
        'agentserve_requests_total{endpoint="/v1/chat/completions",status="200"}',
    ):
        assert name in text, name


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}, "not served here"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL}, "messages"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}, "n=2"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi " * 9000}]}, "maximum context length"),
        # max_tokens over the window: clamped by default, 400 under reject (test_max_tokens_window.py)
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
            "temperature",
        ),
    ],
)
def test_bad_input_is_a_400_with_an_openai_error(server_url, body, needle):
    r = httpx.post(server_url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and needle in err["message"]


def test_malformed_json_is_a_400(server_url):
    r = httpx.post(
        server_url + "/v1/chat/completions",
        content=b'{"model": "x", "messages": [',
        timeout=30,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "model_not_found"


def test_worker_session_key_is_the_routers(hf_engine):
    """No prompt_cache_key: the worker derives the same fallback key as the router, from the body as sent."""
    from server.chat.service import ChatService
    from server.metrics import Metrics
    from server.protocol import ChatCompletionRequest
    from server.session_key import session_key

    raw = {
        "model": MODEL,
        "messages": [{"role": "system", "content": "S", "name": None}, {"role": "user", "content": "u"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "description": None,
                    "strict": True,
                    "parameters": {"type": "object"},
                },
            }
        ],
    }
    service = ChatService(hf_engine, worker_settings(), Metrics())
    prepared = service.prepare_chat(ChatCompletionRequest(**raw), {}, raw_body=raw)
    assert prepared.session == session_key(raw, {})  # what server/routing computes for this body
    assert prepared.session.source == "prefix_hash"
