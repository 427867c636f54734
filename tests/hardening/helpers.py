"""Shared by the hostile-request tests: a normal request, and the check that the worker still
answers one promptly after an attack."""

from __future__ import annotations

import statistics
import time

import httpx

MODEL = "smollm2-135m-instruct"


def chat(
    url: str, timeout: float = 60, headers: dict[str, str] | None = None, **extra: object
) -> httpx.Response:
    body: dict[str, object] = {"model": MODEL, "max_tokens": 2, "temperature": 0}
    body["messages"] = [{"role": "user", "content": "hi"}]
    body.update(extra)
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout, headers=headers)


def clean_latency(url: str, headers: dict[str, str] | None = None) -> float:
    """Median seconds of a one-token request on the idle worker (also warms it up)."""
    times = []
    for _ in range(4):
        t0 = time.monotonic()
        assert chat(url, max_tokens=1, headers=headers).status_code == 200
        times.append(time.monotonic() - t0)
    return statistics.median(times[1:])


def assert_still_answers(url: str, baseline: float, headers: dict[str, str] | None = None) -> None:
    """A normal request right after the attack is served within a second of a clean one
    (the shared CI box is slow: a clean one-token request alone can take a second there)."""
    t0 = time.monotonic()
    r = chat(url, max_tokens=1, timeout=30, headers=headers)
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert took < baseline + 1.0, (
        f"a normal request took {took:.2f}s after the attack ({baseline:.2f}s clean)"
    )
