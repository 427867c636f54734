"""Structured outputs (response_format json_object / json_schema) through the HTTP API, embedded model."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
TOOLS = json.loads((Path(__file__).parents[1] / "fixtures" / "prefixed_agent_tools.json").read_text())
FEW_TOOLS = [t for t in TOOLS if t["function"]["name"] in ("browser_open_site", "shell_exec", "submit")]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
RF = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
ASK = [{"role": "user", "content": "Describe a user of our system as JSON: name, age, role, tags."}]


def post(url, **body):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 64, **body}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=600)


def ok(url, **body):
    r = post(url, **body)
    assert r.status_code == 200, r.text
    return r.json()


def stream_text(url, **body):
    """The content and finish reason of a streamed reply, deltas joined."""
    body = {"model": MODEL, "messages": ASK, "max_tokens": 64, "stream": True, **body}
    content, finish = "", None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            assert not choice["delta"].get("tool_calls")
            content += choice["delta"].get("content") or ""
            finish = choice.get("finish_reason") or finish
    return content, finish


@pytest.mark.slow  # ~35-40 s of sampling: in CI's slow step, to keep the main suite under ~10 min
@pytest.mark.timeout(1800)
def test_twenty_sampled_json_schema_replies_all_validate(server_url):
    seen = set()
    for seed in range(20):
        resp = ok(server_url, response_format=RF, temperature=0.9, seed=seed)
        choice = resp["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        value = json.loads(choice["message"]["content"])
        jsonschema.validate(value, PERSON)
        seen.add(json.dumps(value, sort_keys=True))
    assert len(seen) >= 5  # sampled, not one forced string: the mask fences, the model writes


def test_json_schema_streaming_equals_non_streaming_at_t0(server_url):
    whole = ok(server_url, response_format=RF, temperature=0)["choices"][0]
    content, finish = stream_text(server_url, response_format=RF, temperature=0)
    assert content == whole["message"]["content"] and finish == whole["finish_reason"] == "stop"
    jsonschema.validate(json.loads(content), PERSON)


def test_json_object_is_parseable_json(server_url):
    for seed in range(3):
        resp = ok(
            server_url, response_format={"type": "json_object"}, temperature=0.7, seed=seed, max_tokens=160
        )
        choice = resp["choices"][0]
        if (
            choice["finish_reason"] == "length"
        ):  # a free-form object may run out of budget: never closed for us
            assert choice["message"]["content"].startswith("{")
            continue
        assert isinstance(json.loads(choice["message"]["content"]), dict)


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
@pytest.mark.timeout(1200)
def test_with_tools_auto_the_reply_is_a_call_or_schema_json(server_url):
    """Tools + response_format, tool_choice auto: either valid calls, or content that follows the schema."""
    kinds = set()
    tasks = ["Open https://example.com in the browser.", "Describe a user as JSON.", "List the files here."]
    for seed in range(3):
        msgs = [{"role": "user", "content": tasks[seed]}]
        extra = {"prompt_cache_key": "rf-tools", "temperature": 0.9, "seed": seed}
        resp = ok(server_url, messages=msgs, tools=FEW_TOOLS, response_format=RF, max_tokens=48, **extra)
        msg = resp["choices"][0]["message"]
        if resp["choices"][0].get("incomplete_tool_call"):  # a call cut by max_tokens: reported, not content
            assert resp["choices"][0]["finish_reason"] == "length" and not msg["content"]
            kinds.add("cut call")
        elif msg.get("tool_calls"):
            kinds.add("call")
            assert not msg["content"]
        else:
            kinds.add("json")
            jsonschema.validate(json.loads(msg["content"]), PERSON)
    assert kinds  # both are allowed; which one the model takes is its choice


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
def test_with_tools_none_the_content_follows_the_schema(server_url):
    msgs = [{"role": "user", "content": "Call shell_exec with ls now. <tool_call>"}]
    resp = ok(server_url, messages=msgs, tools=TOOLS, tool_choice="none", response_format=RF, temperature=0)
    msg = resp["choices"][0]["message"]
    assert not msg.get("tool_calls")
    jsonschema.validate(json.loads(msg["content"]), PERSON)


@pytest.mark.parametrize(
    "rf, param",
    [
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": PERSON}}, "response_format.json_schema.name"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "required": 3}},
            },
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": []}},
            "response_format.json_schema.schema",
        ),
        ({"type": "yaml"}, None),
    ],
)
def test_bad_response_format_is_a_400(server_url, rf, param):
    r = post(server_url, response_format=rf)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param, err
