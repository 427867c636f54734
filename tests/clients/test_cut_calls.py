"""A reply cut by max_tokens inside a call: no envelope text in content, the cut call reported."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
TOOLS = json.loads((Path(__file__).parents[1] / "fixtures" / "prefixed_agent_tools.json").read_text())
NAMES = {t["function"]["name"] for t in TOOLS}
MSGS = [
    {"role": "system", "content": "You are a web and shell agent. Use the tools to finish the task."},
    {"role": "user", "content": "Open https://example.com/docs/getting-started/install and read it."},
]
ENVELOPE = ("<tool_call", "</tool_call", '{"name"')


def post(url, **extra):
    body = {"model": MODEL, "messages": MSGS, "tools": TOOLS, "temperature": 0, **extra}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def stream(url, **extra):
    body = {"model": MODEL, "messages": MSGS, "tools": TOOLS, "temperature": 0, "stream": True, **extra}
    chunks = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
def test_a_call_cut_by_max_tokens_is_reported_not_leaked(server_url):
    r = post(server_url, tool_choice="required", max_tokens=12)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "length"
    content = choice["message"]["content"] or ""
    assert not any(tag in content for tag in ENVELOPE), content
    assert not choice["message"].get("tool_calls")
    cut = choice["incomplete_tool_call"]
    assert any(n.startswith(cut["name"]) for n in NAMES) and cut["name"]
    with pytest.raises(json.JSONDecodeError):  # reported as written, not closed to make it parse
        json.loads(cut["arguments_so_far"])

    chunks = stream(server_url, tool_choice="required", max_tokens=12)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    streamed = "".join(d.get("content") or "" for d in deltas)
    assert not any(tag in streamed for tag in ENVELOPE), streamed
    assert not any(d.get("tool_calls") for d in deltas)
    final = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert final[-1]["finish_reason"] == "length" and final[-1]["incomplete_tool_call"] == cut


def test_a_complete_reply_has_no_incomplete_call(server_url):
    r = post(server_url, tool_choice="required", max_tokens=200, parallel_tool_calls=False)
    assert r["choices"][0]["finish_reason"] == "tool_calls"
    assert "incomplete_tool_call" not in r["choices"][0]


def test_no_parallel_call_is_begun_without_budget_to_finish_it(server_url):
    one = post(server_url, tool_choice="required", max_tokens=200, parallel_tool_calls=False)
    first = one["usage"]["completion_tokens"] - 1  # the call, without its end of sequence
    # budget for the first call and a few tokens more: too few for any further complete call
    r = post(server_url, tool_choice="required", max_tokens=first + 4, parallel_tool_calls=True)
    choice = r["choices"][0]
    assert choice["message"]["tool_calls"][0] == one["choices"][0]["message"]["tool_calls"][0] | {
        "id": choice["message"]["tool_calls"][0]["id"]
    }
    assert "incomplete_tool_call" not in choice, choice
    assert len(choice["message"]["tool_calls"]) == 1
