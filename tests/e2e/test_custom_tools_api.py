"""Custom tools (grammar-constrained free-text input) through the HTTP API, embedded model."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.constrain.custom_grammars import TRICKY_REGEX, apply_patch_lark, apply_patch_ok, tricky_ok

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
APPLY_PATCH = {
    "type": "custom",
    "custom": {
        "name": "apply_patch",
        "description": "Edit files with a patch.",
        "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": apply_patch_lark()}},
    },
}
TRICKY = {
    "type": "custom",
    "custom": {
        "name": "tricky",
        "format": {"type": "grammar", "grammar": {"syntax": "regex", "definition": TRICKY_REGEX}},
    },
}
READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}
ASK = [{"role": "user", "content": "Create hello.txt containing 'hi'."}]


def post(url, **body):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 200, **body}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=600)


def stream(url, **body):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 200, "stream": True, **body}
    calls, finish = [], None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"]
                if choice:
                    calls += choice[0]["delta"].get("tool_calls") or []
                    finish = choice[0].get("finish_reason") or finish
    return calls, finish


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
@pytest.mark.timeout(1800)
def test_named_custom_tool_gives_a_valid_custom_call_and_stream_equals_whole(server_url):
    tools = [READ, APPLY_PATCH]
    choice = {"type": "custom", "custom": {"name": "apply_patch"}}
    r = post(server_url, tools=tools, tool_choice=choice, temperature=0, max_tokens=120)
    assert r.status_code == 200, r.text
    out = r.json()["choices"][0]
    assert out["finish_reason"] in ("tool_calls", "length"), out
    if out["finish_reason"] == "tool_calls":
        call = out["message"]["tool_calls"][0]
        assert call["type"] == "custom" and "function" not in call and call["custom"]["name"] == "apply_patch"
        assert apply_patch_ok(call["custom"]["input"]), call
    calls, finish = stream(server_url, tools=tools, tool_choice=choice, temperature=0, max_tokens=120)
    assert finish == out["finish_reason"]
    if finish == "tool_calls":
        assert [c["custom"] for c in calls] == [c["custom"] for c in out["message"]["tool_calls"]]
        assert calls[0]["type"] == "custom" and calls[0]["index"] == 0 and calls[0]["id"]


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
@pytest.mark.timeout(1800)
def test_sampled_regex_custom_calls_match_and_history_round_trips(server_url):
    for seed in range(4):
        r = post(
            server_url, tools=[TRICKY], tool_choice="required", temperature=1.0, seed=seed, max_tokens=120
        )
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        for call in msg.get("tool_calls") or []:
            assert tricky_ok(call["custom"]["input"]), call
        if msg.get("tool_calls"):  # the call goes back as history, with its result
            history = [*ASK, {"role": "assistant", "content": None, "tool_calls": msg["tool_calls"]}]
            history.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "done"})
            again = post(server_url, messages=history, tools=[TRICKY], max_tokens=8)
            assert again.status_code == 200, again.text


@pytest.mark.parametrize(
    "fmt, needle",
    [
        ({"type": "grammar", "grammar": {"syntax": "lark", "definition": 'start: "a" missing'}}, "missing"),
        ({"type": "grammar", "grammar": {"syntax": "regex", "definition": "a(b"}}, "unclosed"),
        ({"type": "grammar", "grammar": {"syntax": "ebnf", "definition": "root ::= 'a'"}}, "lark"),
    ],
)
@pytest.mark.timeout(1800)
def test_a_bad_grammar_is_a_400_naming_the_format(server_url, fmt, needle):
    tool = {"type": "custom", "custom": {"name": "bad", "format": fmt}}
    r = post(server_url, tools=[READ, tool])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "tools[1].custom.format" and needle in err["message"], err
