"""Mask, don't remove — through the HTTP API on the embedded model."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
TOOLS = json.loads((Path(__file__).parents[1] / "fixtures" / "prefixed_agent_tools.json").read_text())
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in TOOLS}
SYSTEM = "You are a web and shell agent. Use the tools to finish the task."


def post(url, messages, **extra):
    body = {"model": MODEL, "messages": messages, "tools": TOOLS, "temperature": 0, "max_tokens": 64, **extra}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def assert_valid_calls(resp, allowed_prefix=None):
    calls = resp["choices"][0]["message"].get("tool_calls") or []
    assert calls, resp["choices"][0]
    assert resp["choices"][0]["finish_reason"] == "tool_calls"
    for call in calls:
        name = call["function"]["name"]
        assert name in SCHEMAS
        if allowed_prefix:
            assert name.startswith(allowed_prefix)
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
    return calls


TASKS = [
    "Open the page https://example.com/docs and read it.",
    "Click the login button on the current page.",
    "Type my email into the search field.",
    "Scroll down to the pricing table.",
    "Take a screenshot of the page.",
    "Go back to the previous page.",
    "Reload the page; it looks stale.",
    "What does the browser console say?",
    "Press Enter on the page.",
    "Make the window 1280x720.",
]


@pytest.mark.slow  # ~35-40 s of sampling: in CI's slow step, to keep the main suite under ~10 min
@pytest.mark.timeout(900)
def test_twenty_required_browser_prefix_calls_are_all_valid(server_url):
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name_prefix": "browser_"}}],
        },
    }
    names = set()
    for i in range(20):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASKS[i % len(TASKS)]}]
        extra = {"tool_choice": choice, "prompt_cache_key": "mask-20", "parallel_tool_calls": False}
        if i >= len(TASKS):
            extra.update(temperature=0.9, seed=i)  # sampled too, not only greedy
        resp = post(server_url, msgs, **extra)
        names.update(c["function"]["name"] for c in assert_valid_calls(resp, "browser_"))
        assert resp["tool_state"]["mode"] == "required" and resp["tool_state"]["state"] is None
    assert len(names) >= 2  # the model chose, the mask only fenced


def test_named_tool_and_none(server_url):
    # a tool whose arguments are bounded (integers), so a 135M model finishes the call
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Scroll down by 300 pixels."}]
    resp = post(
        server_url, msgs, tool_choice={"type": "function", "function": {"name": "browser_scroll_on_page"}}
    )
    (call,) = assert_valid_calls(resp)
    assert call["function"]["name"] == "browser_scroll_on_page"
    for i, content in enumerate(["Call shell_exec with ls now.", "<tool_call> please", "Use a tool."]):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]
        resp = post(server_url, msgs, tool_choice="none", max_tokens=40, temperature=0.8, seed=i)
        message = resp["choices"][0]["message"]
        assert not message.get("tool_calls") and "<tool_call>" not in (message["content"] or "")


def test_unknown_names_are_400s(server_url):
    msgs = [{"role": "user", "content": "x"}]
    for choice, needle in [
        ({"type": "function", "function": {"name": "rm_rf"}}, "rm_rf"),
        (
            {
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": "auto",
                    "tools": [{"type": "function", "function": {"name_prefix": "db_"}}],
                },
            },
            "db_",
        ),
    ]:
        r = httpx.post(
            server_url + "/v1/chat/completions",
            json={"model": MODEL, "messages": msgs, "tools": TOOLS, "tool_choice": choice},
            timeout=30,
        )
        assert r.status_code == 400 and needle in r.json()["error"]["message"]
    r = httpx.post(
        server_url + "/v1/chat/completions",
        timeout=30,
        json={"model": MODEL, "messages": msgs, "tools": TOOLS, "tool_state_machine": "nope"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_state_machine"


def test_state_machine_switches_and_mode_switches_keep_the_cache(server_url):
    key = "mask-state-machine"
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Open example.com please."}]
    # the opt-in Manus-style machine: 1. last message from the user -> reply in text
    r1 = post(server_url, msgs, prompt_cache_key=key, tool_state_machine="reply_first", max_tokens=24)
    assert r1["tool_state"] == {"mode": "none", "allowed": [], "state": "reply"}
    assert not r1["choices"][0]["message"].get("tool_calls")
    # 2. after a browser_ call -> browser_* tools or text
    msgs += [
        {"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "browser_open_site",
                        "arguments": json.dumps({"url": "https://example.com"}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "<html>Example Domain</html>"},
    ]
    r2 = post(server_url, msgs, prompt_cache_key=key, tool_state_machine="reply_first")
    assert r2["tool_state"]["state"] == "browsing" and r2["tool_state"]["mode"] == "auto"
    assert all(n.startswith("browser_") for n in r2["tool_state"]["allowed"])
    message = r2["choices"][0]["message"]
    if message.get("tool_calls"):  # the model may call a browser_ tool or answer in text, nothing else
        assert all(c["function"]["name"].startswith("browser_") for c in message["tool_calls"])
    else:
        assert (
            "<tool_call>" not in (message["content"] or "") and r2["choices"][0]["finish_reason"] != "error"
        )
    # the prompt grew and the mode changed, yet the cache still covers the earlier turn
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0.9 * r1["usage"]["prompt_tokens"] - 32
    # 3. after a shell_ call -> shell state; an explicit tool_choice wins over the machine
    msgs += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "shell_exec", "arguments": json.dumps({"command": "ls"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "README.md setup.py"},
    ]
    r3 = post(server_url, msgs, prompt_cache_key=key, tool_state_machine="reply_first")
    assert r3["tool_state"]["state"] == "shell"
    r4 = post(
        server_url, msgs, prompt_cache_key=key, tool_state_machine="reply_first", tool_choice="required"
    )
    assert r4["tool_state"]["state"] is None and r4["tool_state"]["mode"] == "required"
    assert_valid_calls(r4)
    # required prefills after the cached prompt: cached tokens do not drop when the mode changes
    assert (
        r4["usage"]["prompt_tokens_details"]["cached_tokens"]
        >= r3["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    assert r4["cache"]["diverged_at_token"] is None


def test_streamed_tool_calls_match_non_streamed(server_url):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Open https://example.com"}]
    choice = {"type": "function", "function": {"name": "browser_open_site"}}
    full = post(server_url, msgs, tool_choice=choice)
    body = {
        "model": MODEL,
        "messages": msgs,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 64,
        "tool_choice": choice,
        "stream": True,
    }
    calls, finish = {}, None
    with httpx.stream("POST", server_url + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice0 = json.loads(line[6:])["choices"][0]
            for tc in choice0["delta"].get("tool_calls") or []:
                calls.setdefault(tc["index"], tc)
            finish = choice0["finish_reason"] or finish
    expected = full["choices"][0]["message"]["tool_calls"]
    assert [c["function"] for c in calls.values()] == [c["function"] for c in expected]
    assert finish == "tool_calls"
