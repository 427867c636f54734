"""OpenAI parameters this server does not implement are a 400 naming them, never silently dropped."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
MSGS = [{"role": "user", "content": "Say hi."}]


def post(url, **extra):
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 4, "temperature": 0, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


@pytest.mark.parametrize(
    "field,value",
    [
        ("frequency_penalty", 1.5),
        ("presence_penalty", 0.5),
        ("logit_bias", {"42": -100}),
        ("logprobs", True),
        ("top_logprobs", 3),
        ("top_k", 5),
        ("min_p", 0.1),
        ("repetition_penalty", 1.2),
    ],
)
def test_an_unimplemented_parameter_is_a_400_naming_it(server_url, field, value):
    r = post(server_url, **{field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and field in r.json()["error"]["message"]


def test_neutral_values_and_harmless_unknown_fields_are_accepted(server_url):
    r = post(
        server_url,
        frequency_penalty=0,
        presence_penalty=0.0,
        logit_bias={},
        logprobs=False,
        metadata={"run": "x"},
        store=False,
    )
    assert r.status_code == 200, r.text
