"""gpt-oss (the ``harmony`` family) end to end over HTTP on a random-weight test model with the
Harmony special tokens (SmolLM2's vocabulary + Harmony's; no o200k vocabulary, no real weights).

The generic suites run Harmony too (tests/e2e/test_reasoning_api.py: required reasons then
calls, budgets, stream = non-stream; test_reasoning_dialects.py: Responses reasoning items,
Messages thinking blocks; test_families_api.py: allowed_tools, none, a 10-turn session). Here:
what is Harmony's own — the model picks the final channel or a call after its analysis (auto),
a named tool, ``none`` answers in the final channel (its header is not content), streamed the
same, and a session with answers, where the template drops the analysis and renders past
calls otherwise than the model wrote them (the cache report names it; keep_reasoning does not).
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.e2e.test_reasoning_api import MODEL, SCHEMAS, TOOLS, chat, serve_family, session

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve_family("harmony", tmp_path_factory) as found:
        yield found


def _check_call(msg: dict) -> None:
    assert msg["reasoning_content"], msg
    for call in msg["tool_calls"]:
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


def test_auto_none_and_named(served) -> None:
    _, urls, _ = served
    msgs = [{"role": "user", "content": "What now?"}]
    kinds = set()
    for seed in range(6):
        body = chat(urls[False], msgs, seed=seed, temperature=1.0, max_reasoning_tokens=4, max_tokens=60)
        msg = body["choices"][0]["message"]
        assert msg["reasoning_content"] and "<|" not in msg["reasoning_content"], msg
        if msg.get("tool_calls"):
            _check_call(msg)
            assert body["choices"][0]["finish_reason"] == "tool_calls"
            kinds.add("call")
        else:  # the final channel: its header is not content, no Harmony token in it
            assert msg["content"] is not None and "<|" not in msg["content"], msg
            kinds.add("final")
    assert kinds, kinds
    none = chat(
        urls[False], msgs, tool_choice="none", max_reasoning_tokens=4, max_tokens=40, seed=1, temperature=1.0
    )
    msg = none["choices"][0]["message"]
    assert not msg.get("tool_calls") and msg["reasoning_content"] and "<|" not in (msg["content"] or "")
    named = {"type": "function", "function": {"name": "shell_exit"}}
    msg = chat(urls[False], msgs, tool_choice=named, max_reasoning_tokens=4)["choices"][0]["message"]
    _check_call(msg)
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["shell_exit"]


def test_tokenize_shows_the_gpt_oss_prompt(served) -> None:
    _, urls, tok = served
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": TOOLS,
        "return_text": True,
    }
    r = httpx.post(urls[False] + "/tokenize", json=body, timeout=60).json()
    assert r["text"].startswith("<|start|>system<|message|>You are ChatGPT") and r["text"].endswith(
        "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    )
    assert 'type shell_ls = (_: {\npath: "/" | "/tmp",\n}) => any;' in r["text"]
    assert r["tokens"] == tok(r["text"], add_special_tokens=False)["input_ids"]


def test_final_answer_stream_equals_non_stream(served) -> None:
    _, urls, _ = served
    msgs = [{"role": "user", "content": "Say something."}]
    extra = {
        "tool_choice": "none",
        "max_reasoning_tokens": 5,
        "seed": 2,
        "temperature": 1.0,
        "max_tokens": 30,
    }
    whole = chat(urls[False], msgs, **extra)["choices"][0]["message"]
    body = {
        "model": MODEL,
        "messages": msgs,
        "tools": TOOLS,
        "stream": True,
        "parallel_tool_calls": False,
        **extra,
    }
    reasoning, content = "", ""
    with httpx.stream("POST", urls[False] + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                delta = chunk["choices"][0]["delta"]
                reasoning += delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
    assert whole["content"] and content == whole["content"] and reasoning == whole["reasoning_content"]


def test_session_with_answers_names_the_rewrite_keep_reasoning_is_append_only(served) -> None:
    """Prints both hit rates (run with -s): a final answer every third turn, then a new user message."""
    _, urls, _ = served

    def choice(turn: int) -> str:
        return "none" if turn % 3 == 2 else "required"

    vendor = session(urls[False], "harmony-vendor", choice)
    kept = session(urls[True], "harmony-keep", choice)
    for name, (c, i, t, _) in (("template history", vendor), ("keep_reasoning", kept)):
        print(
            f"\nharmony {name}: cached {c} of ideal {i} ({c / i:.2%}); of all prompt tokens {t} ({c / t:.2%})"
        )
    rewrites = [r for r in vendor[3] if r.get("type") == "template_rewrote_history"]
    # the analysis dropped after an answer is named with the renderer's note (a call's header the
    # template writes otherwise than the model did is named on the reply: tests/e2e/test_reasoning_api.py)
    assert any("not rendered (until_answer" in json.dumps(r) for r in rewrites), vendor[3]
    assert sum(r["missed_tokens"] for r in rewrites) > 0  # recomputed
    assert all(r.get("diverged_at_token") is None for r in kept[3]), kept[3]
    assert kept[0] >= 0.99 * kept[1] and kept[0] / kept[2] > vendor[0] / vendor[2]
