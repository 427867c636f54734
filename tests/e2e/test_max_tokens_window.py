"""max_tokens over the context window (issue 27): clamp serves it bounded, reject refuses it; a prompt
alone over the window is a 400 under both. Served names: served_model_name + served_model_aliases."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from server.config import load_settings
from server.families.model_facts import load_model_facts
from tests.conftest import running_server

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
WINDOW = 8192
EOS_BIAS = {"2": -100}  # <|im_end|>: the reply cannot end on its own, so it runs into the window


SMALL = 1024  # the same model with a 1k window (max_model_len): a clamped reply runs out in seconds


@pytest.fixture(scope="module")
def long_messages(tokenizer) -> list[dict]:
    """A conversation that leaves ~60 tokens of the small window."""
    unit = " ".join(f"line {i}: nothing to see." for i in range(10))
    per = len(tokenizer(unit + "\n", add_special_tokens=False)["input_ids"])
    text = "\n".join([unit] * ((SMALL - 70) // per))
    return [{"role": "user", "content": text + "\nSummarise."}]


@pytest.fixture(scope="module")
def served(hf_engine, embedded_model_dir):
    """Servers on the shared 8k engine: clamp (the default), reject, one with aliases; and clamp on a
    second engine with a 1k window."""
    from server.engines.hf.engine import HFEngine

    small_settings = load_settings(device="cpu", max_model_len=SMALL)
    small = HFEngine(small_settings.engine_settings(), load_model_facts(small_settings, "hf"))
    urls = {}
    with (
        running_server(_app(hf_engine)) as clamp,
        running_server(_app(hf_engine, limits={"max_tokens_over_window": "reject"})) as reject,
        running_server(
            _app(hf_engine, served_model_aliases=["claude-sonnet-4-5", "claude-haiku-4-5"])
        ) as alias,
        running_server(_app(small, max_model_len=SMALL, limits={"min_reply_tokens": 16})) as small_url,
    ):
        urls.update(clamp=clamp, reject=reject, alias=alias, small=small_url)
        yield urls
    asyncio.run(small.shutdown())


def _app(engine, **settings):
    from server.app import build_app

    return build_app(load_settings(device="cpu", tool_state_machine=None, **settings), engine=engine)


def chat(url: str, **body) -> httpx.Response:
    body.setdefault("model", MODEL)
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=300)


def test_clamp_is_the_default():
    assert load_settings().limits.max_tokens_over_window == "clamp"


def test_clamp_serves_32000_on_the_8k_model(served):
    r = chat(served["clamp"], messages=[{"role": "user", "content": "hi"}], max_tokens=32000, temperature=0)
    assert r.status_code == 200, r.text
    body = r.json()
    granted = WINDOW - body["usage"]["prompt_tokens"]
    assert body["max_tokens_clamped"] == {"requested": 32000, "granted": granted}
    assert body["usage"]["completion_tokens"] <= granted


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
def test_a_clamped_reply_that_runs_out_ends_with_length(served, long_messages):
    r = chat(served["small"], messages=long_messages, max_tokens=32000, temperature=0, logit_bias=EOS_BIAS)
    assert r.status_code == 200, r.text
    body = r.json()
    prompt = body["usage"]["prompt_tokens"]
    granted = SMALL - prompt
    assert 0 < granted < 200
    assert body["max_tokens_clamped"] == {"requested": 32000, "granted": granted}
    assert body["usage"]["completion_tokens"] == granted  # bounded by the window, and it got there
    assert body["choices"][0]["finish_reason"] == "length"


def test_clamp_field_rides_on_the_final_stream_chunk(served, long_messages):
    body = {
        "model": MODEL,
        "messages": long_messages,
        "max_completion_tokens": 32000,
        "temperature": 0,
        "logit_bias": EOS_BIAS,
        "stream": True,
    }
    chunks = []
    with httpx.stream("POST", served["small"] + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    final = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    assert final["choices"][0]["finish_reason"] == "length"
    clamp = final["max_tokens_clamped"]
    assert clamp["requested"] == 32000 and 0 < clamp["granted"] < 200
    assert all("max_tokens_clamped" not in c for c in chunks if c is not final)


def test_a_max_tokens_that_fits_is_not_reported(served):
    r = chat(served["clamp"], messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert r.status_code == 200 and "max_tokens_clamped" not in r.json()


def test_reject_refuses_32000_naming_what_fits(served):
    r = chat(served["reject"], messages=[{"role": "user", "content": "hi"}], max_tokens=32000)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "max_tokens" and err["code"] == "context_length_exceeded"
    assert "maximum context length is 8192 tokens" in err["message"]
    assert "max_tokens at most" in err["message"] and "max_tokens_over_window" in err["message"]


@pytest.mark.parametrize("policy", ["clamp", "reject"])
def test_a_prompt_over_the_window_is_a_400_under_both(served, policy):
    messages = [{"role": "user", "content": "hi " * 9000}]
    for extra in ({}, {"max_tokens": 32000}):
        r = chat(served[policy], messages=messages, **extra)
        assert r.status_code == 400, r.text
        assert "maximum context length is 8192 tokens" in r.json()["error"]["message"]
        assert "nothing was truncated" in r.json()["error"]["message"]


def test_models_lists_the_window_and_every_served_name(served):
    plain = httpx.get(served["clamp"] + "/v1/models", timeout=10).json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in plain] == [(MODEL, WINDOW)]
    data = httpx.get(served["alias"] + "/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in data] == [MODEL, "claude-sonnet-4-5", "claude-haiku-4-5"]
    assert {m["max_model_len"] for m in data} == {WINDOW}
    assert [m.get("root") for m in data] == [None, MODEL, MODEL]


def test_an_alias_is_served_and_echoed_an_unknown_name_lists_the_served_ones(served):
    for name in ("claude-haiku-4-5", MODEL):
        r = chat(served["alias"], model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.status_code == 200 and r.json()["model"] == name
    r = chat(served["alias"], model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert all(repr(n) in msg for n in (MODEL, "claude-sonnet-4-5", "claude-haiku-4-5"))
    tok = httpx.post(
        served["alias"] + "/tokenize", json={"model": "claude-sonnet-4-5", "prompt": "hi"}, timeout=10
    )
    assert tok.status_code == 200


def test_every_dialect_reports_the_clamp(served):
    """Responses (max_output_tokens) and Messages (max_tokens) are clamped by the same rule and say so."""
    r = httpx.post(
        served["clamp"] + "/v1/responses",
        json={"model": MODEL, "input": "hi", "max_output_tokens": 32000, "temperature": 0},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    granted = WINDOW - body["usage"]["input_tokens"]
    assert body["max_tokens_clamped"] == {"requested": 32000, "granted": granted}
    assert body["usage"]["output_tokens"] <= granted
    r = httpx.post(
        served["clamp"] + "/v1/messages",
        json={
            "model": MODEL,
            "max_tokens": 32000,
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0,  # a short greedy reply: sampled at 1.0 it can run thousands of tokens
        },
        timeout=300,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    prompt = body["usage"]["input_tokens"] + body["usage"]["cache_read_input_tokens"]
    assert body["max_tokens_clamped"] == {"requested": 32000, "granted": WINDOW - prompt}
    for path, body in (
        ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 32000}),
        (
            "/v1/messages",
            {"model": MODEL, "max_tokens": 32000, "messages": [{"role": "user", "content": "hi"}]},
        ),
    ):
        r = httpx.post(served["reject"] + path, json=body, timeout=300)
        assert r.status_code == 400 and "context" in r.text and "8192" in r.text, (path, r.text)
