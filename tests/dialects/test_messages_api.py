"""Anthropic Messages end to end with the official ``anthropic`` SDK on the embedded model."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from server.app import build_app
from server.config import AuthSettings, LimitsSettings
from tests.conftest import running_server, worker_settings

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
JSON_TYPE = {"content-type": "application/json"}
GREEDY = {"temperature": 0}  # anthropic 2.x has no temperature argument: sent as an extra field
SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: check your work." for i in range(40))
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "cache_control": {"type": "ephemeral"},
}
TIME = {
    "name": "get_time",
    "description": "Current time in a timezone",
    "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
EVENT_TYPES = {
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
}


@pytest.fixture(scope="module")
def claude(server_url):
    return anthropic.Anthropic(base_url=server_url, api_key="test", max_retries=0, timeout=300)


def create(claude, **kw):
    kw.setdefault("max_tokens", 40)
    kw.setdefault("messages", ASK)
    return claude.messages.create(model=MODEL, extra_body={**GREEDY, **kw.pop("extra_body", {})}, **kw)


def test_text_reply(claude):
    r = create(claude, system=SYSTEM, max_tokens=12)
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant" and r.model == MODEL
    assert [b.type for b in r.content] == ["text"] and r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens")
    assert r.usage.cache_creation_input_tokens == 0 and r.usage.output_tokens >= 1
    cache = r.model_extra["cache"]
    assert cache["prompt_tokens"] == r.usage.input_tokens + r.usage.cache_read_input_tokens
    assert cache["cached_tokens"] == r.usage.cache_read_input_tokens
    count = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK)
    assert count.input_tokens == cache["prompt_tokens"]


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
def test_tool_use_then_tool_result_loop_reuses_the_cache(claude):
    tools = [WEATHER, TIME]
    r1 = create(claude, system=SYSTEM, tools=tools, tool_choice={"type": "any"}, max_tokens=60)
    assert r1.stop_reason == "tool_use"
    calls = [b for b in r1.content if b.type == "tool_use"]
    assert calls and all(c.id.startswith("toolu_") and isinstance(c.input, dict) for c in calls)
    assert {c.name for c in calls} <= {"get_weather", "get_time"}
    assert not any(b.type == "text" and "<tool_call" in b.text for b in r1.content)
    results = [{"type": "tool_result", "tool_use_id": c.id, "content": "Sunny, 21 C"} for c in calls]
    history = [*ASK, {"role": "assistant", "content": r1.content}, {"role": "user", "content": results}]
    r2 = create(
        claude, system=SYSTEM, tools=tools, tool_choice={"type": "none"}, messages=history, max_tokens=12
    )
    assert r2.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in r2.content] == ["text"]
    prompt1 = r1.usage.input_tokens + r1.usage.cache_read_input_tokens
    assert r2.usage.cache_read_input_tokens >= 0.8 * prompt1  # turn 2 read turn 1's prompt from cache
    count = claude.messages.count_tokens(model=MODEL, system=SYSTEM, tools=tools, messages=history)
    assert count.input_tokens == r2.usage.input_tokens + r2.usage.cache_read_input_tokens


def test_tool_choice_tool_and_none(claude):
    r = create(
        claude,
        tools=[WEATHER, TIME],
        tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
    )
    assert r.stop_reason == "tool_use" and [b.name for b in r.content if b.type == "tool_use"] == ["get_time"]
    assert r.model_extra["tool_state"]["allowed"] == ["get_time"]
    r = create(claude, tools=[WEATHER, TIME], tool_choice={"type": "none"}, max_tokens=8)
    assert all(b.type == "text" for b in r.content) and r.stop_reason != "tool_use"


def test_max_tokens_larger_than_the_window_is_lowered_not_refused(claude):
    r = create(
        claude,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        max_tokens=10**6,
    )
    assert r.stop_reason == "tool_use"


def test_a_cut_call_never_leaks_into_text(claude):
    r = create(claude, tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=6)
    assert r.stop_reason == "max_tokens"
    assert not any(b.type == "tool_use" for b in r.content)
    assert not any("<tool_call" in b.text or '"name"' in b.text for b in r.content if b.type == "text")
    assert r.model_extra["incomplete_tool_call"]["name"] in (
        "",
        "get_weather"[: len(r.model_extra["incomplete_tool_call"]["name"])],
    )


def test_stop_sequence(claude):
    free = create(claude, max_tokens=16).content[0].text
    stop = free[4:7]
    assert stop and stop in free
    r = create(claude, max_tokens=16, stop_sequences=[stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert (r.content[0].text if r.content else "") == free[: free.find(stop)]


def test_stream_events_parse_and_the_final_message_matches_create(claude, server_url):
    one_call = {"type": "any", "disable_parallel_tool_use": True}
    kw = {"system": SYSTEM, "tools": [WEATHER], "tool_choice": one_call, "max_tokens": 60}
    seen = []
    with claude.messages.stream(model=MODEL, messages=ASK, extra_body=GREEDY, **kw) as stream:
        for event in stream:
            seen.append(event)
        final = stream.get_final_message()
    raw_types = [e.type for e in seen if e.type in EVENT_TYPES]
    assert raw_types[0] == "message_start" and raw_types[-2:] == ["message_delta", "message_stop"]
    assert "content_block_start" in raw_types and "content_block_stop" in raw_types
    blocking = create(claude, **kw)

    def blocks(m):  # ids differ per response
        return [{k: v for k, v in b.model_dump().items() if k != "id"} for b in m.content]

    assert blocks(final) == blocks(blocking)
    assert final.stop_reason == blocking.stop_reason == "tool_use"
    assert final.usage.output_tokens == blocking.usage.output_tokens
    total = final.usage.input_tokens + final.usage.cache_read_input_tokens
    assert total == blocking.usage.input_tokens + blocking.usage.cache_read_input_tokens

    # the wire: named events whose name is the data's type, a ping, no [DONE], extensions on message_delta
    body = {"model": MODEL, "messages": ASK, "stream": True, **GREEDY, **kw}
    names, datas = [], []
    with httpx.stream("POST", server_url + "/v1/messages?beta=true", json=body, timeout=300) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
            elif line.startswith("data: "):
                datas.append(json.loads(line[6:]))
    assert names == [d["type"] for d in datas] and "ping" in names
    delta = next(d for d in datas if d["type"] == "message_delta")
    assert delta["cache"]["prompt_tokens"] == total and delta["tool_state"]["mode"] == "required"


def test_a_changing_billing_header_costs_no_cache(claude):
    def system(h):
        billing = f"x-anthropic-billing-header: cc_version=2.1.328.{h}; cc_entrypoint=sdk-cli; cch={h}{h};"
        return [
            {"type": "text", "text": billing},
            {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
        ]

    first = [{"role": "user", "content": "Describe the billing test."}]
    r1 = create(claude, system=system("a1b2c"), messages=first, max_tokens=8)
    history = [*first, {"role": "assistant", "content": r1.content}, {"role": "user", "content": "More."}]
    r2 = create(claude, system=system("f9e8d"), messages=history, max_tokens=8)
    prompt1 = r1.usage.input_tokens + r1.usage.cache_read_input_tokens
    assert r2.usage.cache_read_input_tokens >= prompt1 - 16  # all of turn 1 but a partial last block
    assert r2.model_extra["cache"]["type"] is None and r2.model_extra["cache"]["diverged_at_token"] is None


def test_diagnostics_previous_message_id(claude):
    msgs = [{"role": "user", "content": "Diagnostics test."}]
    r1 = create(claude, system=SYSTEM, messages=msgs, max_tokens=4, diagnostics={"previous_message_id": None})
    assert r1.diagnostics is not None and r1.diagnostics.cache_miss_reason is None
    changed = "Today is a new day. " + SYSTEM
    r2 = create(
        claude, system=changed, messages=msgs, max_tokens=4, diagnostics={"previous_message_id": r1.id}
    )
    reason = r2.diagnostics.cache_miss_reason
    assert reason.type == "system_changed" and reason.cache_missed_input_tokens > 0
    r3 = create(
        claude, system=SYSTEM, messages=msgs, max_tokens=4, diagnostics={"previous_message_id": "msg_unknown"}
    )
    assert r3.diagnostics.cache_miss_reason.type == "previous_message_not_found"
    assert create(claude, system=SYSTEM, messages=msgs, max_tokens=4).diagnostics is None  # not asked


def test_bad_requests_are_anthropic_errors(claude, server_url):
    orphan = [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}]}
    ]
    with pytest.raises(anthropic.BadRequestError) as exc:
        create(claude, messages=orphan)
    assert exc.value.body["type"] == "error" and exc.value.body["error"]["type"] == "invalid_request_error"
    assert "toolu_x" in exc.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="not served here"):
        claude.messages.create(model="claude-nope", max_tokens=4, messages=ASK)
    r = httpx.post(server_url + "/v1/messages", json={"model": MODEL, "messages": ASK}, timeout=60)
    assert (
        r.status_code == 400 and r.json()["type"] == "error" and "max_tokens" in r.json()["error"]["message"]
    )
    r = httpx.post(server_url + "/v1/messages", content=b"{not json", timeout=60, headers=JSON_TYPE)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server_url + "/v1/messages", content=b"{}", timeout=60)  # no JSON content type
    assert r.status_code == 415 and r.json()["type"] == "error"
    r = httpx.get(server_url + "/v1/messages/nope", timeout=60)
    assert r.status_code == 404 and r.json() == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "Not Found"},
    }
    r = httpx.post(server_url + "/v1/chat/completions", json={"model": MODEL}, timeout=60)
    assert "error" in r.json() and "type" not in r.json()  # chat keeps OpenAI's shape


def test_front_door_errors_in_anthropic_shape(hf_engine):
    limits = LimitsSettings(max_request_bytes=4096, max_concurrent_requests=1, max_queued_requests=0)
    settings = worker_settings().model_copy(
        update={"auth": AuthSettings(api_keys={"t": "sk-good"}), "limits": limits}
    )
    with running_server(build_app(settings, engine=hf_engine)) as url:
        wrong = anthropic.Anthropic(base_url=url, api_key="sk-wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as exc:
            wrong.messages.create(model=MODEL, max_tokens=4, messages=ASK)
        assert exc.value.body["error"]["type"] == "authentication_error"
        good = anthropic.Anthropic(base_url=url, auth_token="sk-good", max_retries=0, timeout=300)
        with pytest.raises(anthropic.ContentTooLargeError) as exc:
            good.messages.create(
                model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "x" * 5000}]
            )
        assert exc.value.body["error"]["type"] == "request_too_large"
        with good.messages.stream(model=MODEL, max_tokens=40, messages=ASK, extra_body=GREEDY) as held:
            next(iter(held))  # the stream holds the one slot
            with pytest.raises(anthropic.RateLimitError) as exc:
                good.messages.create(model=MODEL, max_tokens=4, messages=ASK)
            assert exc.value.body["error"]["type"] == "rate_limit_error"
