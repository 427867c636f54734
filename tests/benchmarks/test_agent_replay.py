"""``agentserve bench agents`` (benchmarks/compare/agents.py): the replay's own parsing of both
dialects' streams, tool-call validity and the billing-hash arm, on the embedded model."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from benchmarks.compare.agents import offered_tools, replay_turn, valid_call, with_billing_hash
from server.app import build_app
from tests.conftest import worker_settings

MODEL = "smollm2-135m-instruct"
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
# the e2e calls: a short bound, or the 135M model's free-running string outlasts max_tokens (a cut call)
SHORT = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 8}}, "required": ["path"]}
BILLING = "x-anthropic-billing-header: cc_version=2.1.328.ccf; cc_entrypoint=sdk-cli;"


def captured(path: str, body: dict[str, Any], query: str = "") -> dict[str, Any]:
    return {"method": "POST", "path": path, "query": query, "headers": {"x-app": "cli"}, "body": body}


def test_billing_hash_arm_changes_only_that_line_and_differs_per_request():
    system = [{"type": "text", "text": BILLING}, {"type": "text", "text": "You are Claude Code."}]
    reqs = [captured("/v1/messages", {"system": system, "messages": []}) for _ in range(2)]
    lines = [r["body"]["system"][0]["text"] for r in with_billing_hash(reqs)]
    assert all(line.startswith(BILLING + " cch=") and line.endswith(";") for line in lines)
    assert lines[0] != lines[1]
    assert [r["body"]["system"][1] for r in with_billing_hash(reqs)] == [system[1]] * 2
    assert reqs[0]["body"]["system"][0]["text"] == BILLING  # the capture itself is left alone


def test_tool_call_validity():
    tools = offered_tools(
        {
            "tools": [
                {"type": "function", "name": "read_file", "parameters": SCHEMA},
                {"type": "namespace", "name": "crm", "tools": [{"name": "lookup", "parameters": SCHEMA}]},
                {"type": "custom", "name": "apply_patch"},
            ]
        }
    )
    assert valid_call(tools, "read_file", '{"path": "a.py"}')
    assert not valid_call(tools, "read_file", '{"file": "a.py"}')  # against the schema
    assert not valid_call(tools, "read_file", '{"path": ')  # not JSON
    assert not valid_call(tools, "write_file", '{"path": "a.py"}')  # not offered
    assert valid_call(tools, "crm\x00lookup", '{"path": "x"}') and not valid_call(tools, "lookup", "{}")
    assert valid_call(tools, "apply_patch", "*** Begin Patch")


@pytest.fixture(scope="module")
def client(hf_engine):
    with TestClient(build_app(worker_settings(), engine=hf_engine)) as c:
        yield c


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
@pytest.mark.e2e
def test_replay_reads_both_dialects_streams(client):
    ask = [{"role": "user", "content": "Read a.py"}]
    tool = {"name": "Read", "input_schema": SHORT}
    body = {"model": "x", "max_tokens": 48, "temperature": 0, "stream": True, "messages": ask}
    body.update(tools=[tool], tool_choice={"type": "any"})
    row = replay_turn(client, captured("/v1/messages", body, "beta=true"), MODEL)
    assert row["errors"] == [] and row["calls"] == 1 and row["valid_calls"] == 1, row
    assert row["prompt"] > 20 and row["ttft_ms"] is not None
    again = replay_turn(client, captured("/v1/messages", body), MODEL)
    assert again["cached"] > 0 and again["prompt"] == row["prompt"]
    fn = {"type": "function", "name": "Read", "parameters": SHORT}
    body = {"model": "x", "input": "Read a.py", "tools": [fn], "tool_choice": "required", "stream": True}
    body.update(max_output_tokens=48, temperature=0)
    row = replay_turn(client, captured("/v1/responses", body), MODEL)
    assert row["errors"] == [] and row["calls"] == 1 and row["valid_calls"] == 1 and row["prompt"] > 20, row
    bad = replay_turn(client, captured("/v1/responses", {"model": "x", "stream": True}), MODEL)
    assert bad["errors"] and bad["errors"][0].startswith("HTTP 400")
