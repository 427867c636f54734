"""benchmarks/agents/redact_capture.py: a capture's prose becomes same-length filler, everything the replay
measures is kept (structure, schemas, tool calls, the billing-header line, repeats identical)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.agents.redact_capture import filler, redact_row

BILLING = "x-anthropic-billing-header: cc_version=2.1.328.ccf; cc_entrypoint=sdk-cli;"
PROSE = "You are Claude Code, Anthropic's official CLI.\nUse the tools below to help the user."
CC = {"type": "ephemeral"}
PATH = {"type": "string", "description": "The absolute path to the file."}
REPO_CAPTURES = Path(__file__).resolve().parents[2] / "benchmarks/data/agent_captures"


def row(text: str) -> dict:
    tool = {
        "name": "Read",
        "description": "Reads a file from the local filesystem.",
        "input_schema": {"type": "object", "properties": {"file_path": PATH}},
    }
    use = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/w/a.py"}}
    body = {
        "system": [{"type": "text", "text": BILLING}, {"type": "text", "text": text, "cache_control": CC}],
        "messages": [{"role": "assistant", "content": [use]}],
        "tools": [tool],
    }
    headers = {"x-api-key": "k"}
    return {"method": "POST", "path": "/v1/messages", "query": "", "headers": headers, "body": body}


def test_filler_keeps_length_and_newlines_and_is_a_function_of_the_text():
    for text in (PROSE, "a", "two words", "x" * 1000, "\n\nlead"):
        out = filler(text)
        assert len(out) == len(text)
        assert [i for i, c in enumerate(out) if c == "\n"] == [i for i, c in enumerate(text) if c == "\n"]
    assert filler(PROSE) == filler(PROSE) != filler(PROSE + " ")
    assert "Claude" not in filler(PROSE)


def test_redacted_row_keeps_what_the_replay_measures():
    original = row(PROSE)
    out = redact_row(original)
    system = out["body"]["system"]
    assert system[0]["text"] == BILLING and system[1]["cache_control"] == CC
    assert system[1]["text"] == filler(PROSE)
    tool = out["body"]["tools"][0]
    assert tool["name"] == "Read" and tool["description"] != original["body"]["tools"][0]["description"]
    assert tool["input_schema"]["properties"]["file_path"]["type"] == "string"
    assert tool["input_schema"]["properties"]["file_path"]["description"] == filler(PATH["description"])
    assert out["body"]["messages"] == original["body"]["messages"]  # the tool call as the client sent it
    assert out["headers"] == {"x-api-key": "REDACTED"}
    assert original["body"]["system"][1]["text"] == PROSE  # the input is left alone


def test_the_committed_captures_replay_as_two_turn_sessions():
    from benchmarks.compare.agents import load

    sessions = load(REPO_CAPTURES)
    assert sorted(sessions) == ["claude", "codex"]
    for requests in sessions.values():
        assert len(requests) == 2
        for r in requests:
            assert not {"authorization", "x-api-key"} & set(r["headers"])
    system = sessions["claude"][0]["body"]["system"]
    assert system[0]["text"].startswith("x-anthropic-billing-header")
    text = json.dumps(sessions["claude"])
    assert "Claude Code" not in text and "Anthropic" not in text
