"""Neutral parameter values and harmless unknown fields are accepted (each parameter's effect:
tests/e2e/test_parameters_api.py)."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
MSGS = [{"role": "user", "content": "Say hi."}]


def post(url, **extra):
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 4, "temperature": 0, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


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
