"""Small attack surfaces: metric labels from route templates only, request-chosen state machines by
name only, noncharacters in tool definitions."""

from __future__ import annotations

import httpx
import pytest

from tests.hardening.helpers import assert_still_answers, chat, clean_latency

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def url(hf_engine):
    from server.app import build_app
    from tests.conftest import running_server, worker_settings

    with running_server(build_app(worker_settings(), engine=hf_engine)) as u:
        yield u


def test_metric_labels_never_carry_raw_paths(url):
    for i in range(30):
        httpx.post(f"{url}/v1/attack-{i}-series", json={}, timeout=10)
        httpx.get(f"{url}/v1/models/x{i}", timeout=10)
    assert chat(url).status_code == 200
    text = httpx.get(url + "/metrics", timeout=10).text
    assert "attack-" not in text and "/v1/models/x" not in text
    assert 'endpoint="/v1/chat/completions"' in text and 'endpoint="other"' in text


@pytest.mark.parametrize(
    "name", ["x.yml", "../grammars/agent", "agent.yaml", "/etc/passwd", "a\\b", "..", ""]
)
def test_a_request_names_a_state_machine_never_a_path(url, name):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    r = chat(url, tools=tools, tool_state_machine=name)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tool_state_machine"


@pytest.mark.parametrize("char", ["\ufdd0", "\ufdd1", "\ufdd2"])
def test_noncharacters_in_tool_definitions_are_not_a_500(url, char):
    baseline = clean_latency(url)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": f"bad {char} text",
                "parameters": {
                    "type": "object",
                    "properties": {f"p{char}": {"type": "string", "enum": [char]}},
                },
            },
        }
    ]
    r = chat(url, tools=tools, tool_choice="required", max_tokens=8)
    assert r.status_code == 400 and "U+FDD0" in r.json()["error"]["message"], r.text
    assert_still_answers(url, baseline)


@pytest.mark.e2e
def test_unknown_field_names_are_remembered_and_logged_boundedly(url, caplog):
    import logging

    from server.chat import sampling
    from server.log_budget import REQUEST_LOG

    with caplog.at_level(logging.WARNING, logger="server.chat.sampling"):
        for batch in range(3):
            extra = {f"junk_{batch}_{i}_" + "x" * 500: 1 for i in range(200)}
            assert chat(url, **extra).status_code == 200
    assert len(sampling._logged) <= sampling.MAX_LOGGED_FIELDS
    lines = [r.getMessage() for r in caplog.records if r.name == "server.chat.sampling"]
    assert len(lines) <= sampling.MAX_LOGGED_FIELDS + 1
    assert all(len(REQUEST_LOG.unsuffixed(line)) < 200 for line in lines)


@pytest.mark.e2e
@pytest.mark.parametrize("char", ["\ufdd0", "\ufdd1", "\ufdd2"])
@pytest.mark.parametrize("where", ["name", "arguments", "tool_result", "schema_key"])
def test_noncharacters_anywhere_in_a_tool_conversation_are_not_a_500(url, char, where):
    name = f"f{char}" if where == "name" else "f"
    props = {f"k{char}" if where == "schema_key" else "k": {"type": "string"}}
    tools = [
        {
            "type": "function",
            "function": {"name": name, "parameters": {"type": "object", "properties": props}},
        }
    ]
    args = '{"k": "' + (char if where == "arguments" else "v") + '"}'
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": char if where == "tool_result" else "ok"},
    ]
    r = chat(url, tools=tools, messages=messages, max_tokens=4)
    assert r.status_code == 400, r.text  # every family refuses it the same way, before rendering
    assert "U+FDD0" in r.json()["error"]["message"]
