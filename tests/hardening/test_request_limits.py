"""Bounded requests: stop strings (count, length, searched only over the new text), stop_token_ids,
logit_bias and message count are 400s naming their limit, before anything is rendered; the worker
keeps answering normal requests at once."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.chat.generate import StopFinder
from tests.hardening.helpers import assert_still_answers, chat, clean_latency


def _reference(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.text(alphabet="ab\n", min_size=0, max_size=4), min_size=1, max_size=40),
    stops=st.lists(st.text(alphabet="ab\n", min_size=0, max_size=5), min_size=0, max_size=4),
)
def test_windowed_stop_search_finds_what_a_whole_text_search_finds(pieces, stops):
    finder, text = StopFinder(stops), ""
    for piece in pieces:
        text += piece
        got = finder.find(text)
        assert got == _reference(text, stops), (text, stops)
        if got is not None:
            break


def test_stop_search_per_token_does_not_grow_with_the_reply():
    stops = [f"{i:04d}" + "z" * 250 for i in range(16)]  # the default limits: 16 stops, 256 chars
    finder = StopFinder(stops)
    text = "y" * 2_000_000
    finder.find(text)  # the first call searches it all (once)
    t0 = time.perf_counter()
    for _ in range(200):
        text += "yy"
        assert finder.find(text) is None
    per_token = (time.perf_counter() - t0) / 200
    # a whole-reply search costs ~16 x 2 MB of scanning per token (milliseconds); a window, microseconds
    assert per_token < 0.0005, per_token


@pytest.fixture(scope="module")
def url(hf_engine):
    from server.app import build_app
    from tests.conftest import running_server, worker_settings

    with running_server(build_app(worker_settings(), engine=hf_engine)) as u:
        yield u


@pytest.fixture(scope="module")
def baseline(url):
    return clean_latency(url)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("extra", "setting", "param"),
    [
        ({"stop": [f"s{i}" for i in range(10_000)]}, "limits.max_stop_sequences", "stop"),
        ({"stop": "x" * 100_000}, "limits.max_stop_chars", "stop"),
        ({"stop_token_ids": list(range(5000))}, "limits.max_stop_token_ids", "stop_token_ids"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "limits.max_logit_bias", "logit_bias"),
        ({"messages": [{"role": "user", "content": "a"}] * 5000}, "limits.max_messages", "messages"),
    ],
)
def test_oversized_request_parts_are_400s_naming_the_limit(url, baseline, extra, setting, param):
    r = chat(url, **extra)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert setting in err["message"] and err["param"] == param
    assert_still_answers(url, baseline)


@pytest.mark.e2e
def test_stop_strings_within_the_limits_still_work(url):
    r = chat(url, stop=[f"s{i}" for i in range(16)], max_tokens=4)
    assert r.status_code == 200


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("extra", "setting"),
    [
        ({"messages": [{"role": "user", "content": "a"}] * 5000}, "limits.max_messages"),
        (
            {
                "messages": [{"role": "user", "content": "a"}],
                "tools": [{"type": "function", "function": {"name": f"t{i}"}} for i in range(200)],
            },
            "limits.max_tools",
        ),
    ],
)
def test_tokenize_has_the_limits_of_chat(url, baseline, extra, setting):
    import httpx

    r = httpx.post(url + "/tokenize", json=extra, timeout=60)
    assert r.status_code == 400 and setting in r.json()["error"]["message"], r.text
    assert_still_answers(url, baseline)
