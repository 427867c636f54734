"""Retention hints in every dialect: Anthropic ``cache_control`` ttl, OpenAI ``prompt_cache_retention``
(Responses and Chat Completions) → ``retention_hint_s`` → ``GenerationRequest.retain_s`` → the
session's ``keep_s`` in the prefix cache (what the policy does with it: tests/kvcache)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.api.responses import ResponseJob
from server.app import build_app
from server.dialects.messages.request import MessagesBody, convert
from server.errors import InvalidRequest
from server.protocol import ChatCompletionRequest
from tests.conftest import worker_settings

MODEL = "smollm2-135m-instruct"
EPHEMERAL = {"type": "ephemeral"}


def messages_hint(**body: Any) -> float:
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **body}
    return convert(MessagesBody.model_validate(body), body).chat.retention_hint_s()


def text_block(text: str, control: dict[str, Any] | None) -> dict[str, Any]:
    return {"type": "text", "text": text, **({"cache_control": control} if control else {})}


def test_messages_longest_cache_control_ttl_is_the_hint():
    assert messages_hint() == 0.0
    assert messages_hint(system=[text_block("rules", EPHEMERAL)]) == 300.0  # no ttl: 5 minutes
    tool = {"name": "Read", "input_schema": {"type": "object"}, "cache_control": {**EPHEMERAL, "ttl": "1h"}}
    system = [text_block("a", EPHEMERAL), text_block("b", {**EPHEMERAL, "ttl": "5m"})]
    assert messages_hint(system=system, tools=[tool]) == 3600.0
    user = {"role": "user", "content": [text_block("hi", {**EPHEMERAL, "ttl": "1h"})]}
    assert messages_hint(messages=[user]) == 3600.0
    assert messages_hint(cache_control=EPHEMERAL) == 300.0  # top level (automatic caching)


@pytest.mark.parametrize(
    ("control", "where"),
    [({**EPHEMERAL, "ttl": "2h"}, "messages.0.content.0"), ({"type": "persistent"}, "messages.0.content.0")],
)
def test_messages_bad_cache_control_is_a_400_naming_it(control, where):
    user = {"role": "user", "content": [text_block("hi", control)]}
    with pytest.raises(InvalidRequest) as exc:
        messages_hint(messages=[user])
    assert exc.value.param == f"{where}.cache_control"
    assert '"5m" or "1h"' in exc.value.message


CONVERT_ONLY = SimpleNamespace(settings=worker_settings())  # a job's conversion reads only the limits


def responses_hint(value: Any) -> float:
    body = {"model": MODEL, "input": "hi", "prompt_cache_retention": value}
    job = ResponseJob(CONVERT_ONLY, {}, "", body, None)  # type: ignore[arg-type]  (conversion only)
    return job.req.retention_hint_s()


def test_responses_prompt_cache_retention_is_the_hint():
    assert responses_hint(None) == 0.0
    assert responses_hint("in-memory") == 0.0
    assert responses_hint("24h") == 86400.0
    with pytest.raises(InvalidRequest) as exc:
        responses_hint("forever")
    assert exc.value.param == "prompt_cache_retention"


def test_chat_completions_prompt_cache_retention_and_extension():
    def hint(**kw: Any) -> float:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **kw}
        return ChatCompletionRequest.model_validate(body).retention_hint_s()

    assert hint() == 0.0
    assert hint(prompt_cache_retention="24h") == 86400.0
    assert hint(cache_retention_s=90) == 90.0


@pytest.mark.e2e
def test_hint_reaches_the_sessions_keep_alive_and_the_next_request_resets_it(hf_engine):
    def keep_s(key: str) -> list[float]:
        return [s.keep_s for s in hf_engine.cache.book.sessions.values() if key in s.key]

    system = [text_block("You are terse.", {**EPHEMERAL, "ttl": "1h"})]
    ask = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(build_app(worker_settings(), engine=hf_engine)) as c:
        r = c.post("/v1/messages", json={**ask, "system": system, "prompt_cache_key": "hint-cc"})
        assert r.status_code == 200, r.text
        assert keep_s("hint-cc") == [600.0]  # capped: limits.max_retention_s (prefix_cache.session_cap_s)
        assert r.json()["cache"]["retention_hint"] == {"requested_s": 3600.0, "used": True, "held_s": 600.0}
        r = c.post("/v1/messages", json={**ask, "system": "You are terse.", "prompt_cache_key": "hint-cc"})
        assert r.status_code == 200 and keep_s("hint-cc") == [0.0]
        assert "retention_hint" not in r.json()["cache"]  # no hint, nothing to say
        assert c.get("/health").json()["retention_hints"] == {"used": True}
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 2, "prompt_cache_key": "hint-resp"}
        r = c.post("/v1/responses", json={**body, "prompt_cache_retention": "24h"})
        assert r.status_code == 200, r.text
        assert keep_s("hint-resp") == [600.0]


@pytest.mark.e2e
def test_a_hint_the_cache_does_not_use_is_said_in_the_response_and_health(hf_engine, monkeypatch):
    """Never a silently ignored parameter: under ``prefix_cache.policy: lru`` (and on the vllm engine
    with its session hold off, ``vllm.session_hold_s: 0``:
    tests/engines/vllm/test_retention_hints.py) the response says the hint was not used, and why."""
    pc = hf_engine.settings.prefix_cache.model_copy(update={"policy": "lru"})
    monkeypatch.setattr(hf_engine, "settings", hf_engine.settings.model_copy(update={"prefix_cache": pc}))
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 2, "prompt_cache_key": "hint-lru"}
    with TestClient(build_app(worker_settings(), engine=hf_engine)) as c:
        r = c.post("/v1/responses", json={**body, "prompt_cache_retention": "24h"})
        assert r.status_code == 200, r.text
        hint = r.json()["cache"]["retention_hint"]
        assert hint["requested_s"] == 86400.0 and hint["used"] is False and "'lru'" in hint["reason"]
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = c.post("/v1/chat/completions", json={**chat, "cache_retention_s": 60})
        assert hint.pop("held_s") == 600.0  # the 24 h hint, capped (limits.max_retention_s)
        assert r.json()["cache"]["retention_hint"] == {**hint, "requested_s": 60.0}
        health = c.get("/health").json()["retention_hints"]
        assert health == {"used": False, "reason": hint["reason"]}


def responses_parts_hint(*parts: dict[str, Any], **body: Any) -> float:
    item = {"type": "message", "role": "user", "content": list(parts)}
    job = ResponseJob(CONVERT_ONLY, {}, "", {"model": MODEL, "input": [item], **body}, None)  # type: ignore[arg-type]
    return job.req.retention_hint_s()


def test_responses_input_part_breakpoints_are_hints_though_their_text_is_joined():
    plain = {"type": "input_text", "text": "rules "}
    marked = {"type": "input_text", "text": "hi", "prompt_cache_breakpoint": {"mode": "explicit"}}
    assert responses_parts_hint(plain) == 0.0
    assert responses_parts_hint(plain, marked) == 1800.0  # no ttl: 30m
    assert responses_parts_hint(plain, marked, prompt_cache_options={"ttl": "12h"}) == 43200.0  # inherits
    long = {**marked, "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "12h"}}
    assert responses_parts_hint(marked, long) == 43200.0
    job = ResponseJob(
        CONVERT_ONLY, {}, "", {"model": MODEL, "input": [{"role": "user", "content": [plain, long]}]}, None
    )  # type: ignore[arg-type]
    assert job.req.messages[-1].content == "rules hi"  # the prompt is unchanged: one joined message


def test_responses_bad_part_breakpoint_is_a_400_naming_it():
    bad = {"type": "input_text", "text": "hi", "prompt_cache_breakpoint": {"ttl": "1h"}}
    with pytest.raises(InvalidRequest) as exc:
        responses_parts_hint(bad)
    assert exc.value.param == "input[0].content[0].prompt_cache_breakpoint"
    assert "'30m' or '12h'" in exc.value.message
