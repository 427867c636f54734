"""Through the HTTP API on the embedded model: the reply sent back is reused, and the cache knows
what the session waits on (the chat service's hook), so retention can use it."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell_exec",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]


def test_tool_call_reply_sent_back_is_reused_and_the_session_waits_on_the_tool(client, hf_engine):
    client = client.with_options(timeout=600)  # a tool schema's first grammar compile on a busy machine
    key = "kv-e2e-tool-wait"
    msgs = [
        {"role": "system", "content": "You are a coding agent. " * 20},
        {"role": "user", "content": "List the files in the current folder."},
    ]
    r1 = client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=48,
        temperature=0,
        extra_body={"prompt_cache_key": key},
    )
    calls = r1.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "shell_exec"
    s = hf_engine.cache.sessions.get(key)
    assert s is not None and s.state == "tool" and s.waiting_on == ("shell_exec",)
    msgs += [
        r1.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": "README.md\nserver/\ntests/"},
    ]
    r2 = client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        tools=TOOLS,
        max_tokens=4,
        temperature=0,
        extra_body={"prompt_cache_key": key},
    )
    cached = r2.usage.prompt_tokens_details.cached_tokens
    p1 = r1.usage.prompt_tokens
    # the whole previous prompt (before: only its full 32-token blocks), and then some of the reply
    assert cached >= p1
    report = hf_engine.lookup_report(key)
    assert report.state == "tool" and report.waiting_on == ("shell_exec",) and report.evicted_tokens == 0
    # what share of the generated reply the next turn reused (the template renders the call back)
    reused = min(cached - p1, r1.usage.completion_tokens)
    print(f"reply tokens reused: {reused} of {r1.usage.completion_tokens}")
