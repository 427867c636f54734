"""Over HTTP with the openai client (embedded model): type, cost and fix; comparisons; metrics."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
SYSTEM = "You are a careful coding agent. " + " ".join(f"Rule {i}: check your work." for i in range(20))
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
    for n in ("shell_exec", "file_read", "browser_open")
]


def ask(client, messages, key, **kw):
    extra = {"prompt_cache_key": key, **kw.pop("extra_body", {})}
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0, extra_body=extra, **kw
    )


def test_session_report_types_cost_and_fix(client, server_url):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is in README.md?"}]
    r1 = ask(client, msgs, "diag-e2e")
    c1 = r1.model_extra["cache"]
    assert c1["type"] == "first_request"
    assert c1["missed_tokens"] == r1.usage.prompt_tokens - c1["cached_tokens"]  # shared prefixes count
    msgs += [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "More."},
    ]
    r2 = ask(client, msgs, "diag-e2e")
    c2 = r2.model_extra["cache"]
    assert c2["type"] is None and c2["missed_tokens"] == 0 and c2["compared_with"] == "session"
    stamped = [{"role": "system", "content": SYSTEM[:6] + "[07:41:07] " + SYSTEM[6:]}, *msgs[1:]]
    r3 = ask(client, stamped, "diag-e2e")
    c3 = r3.model_extra["cache"]
    assert c3["type"] == "system_changed" and c3["detail"] == {"character": 6}
    assert "character 6 of the system message" in c3["fix"]
    assert c3["missed_tokens"] > 0 and c3["missed_seconds"] > 0  # priced at the measured prefill rate
    assert c3["cached_tokens"] + c3["missed_tokens"] <= r3.usage.prompt_tokens
    metrics = httpx.get(server_url + "/metrics").text
    assert 'agentserve_cache_misses_total{type="system_changed"}' in metrics
    assert 'agentserve_cache_missed_tokens_total{type="system_changed"}' in metrics


def test_compare_with_a_named_response_both_spellings(client):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List the files."}]
    base = ask(client, msgs, "diag-cmp-a", tools=TOOLS)
    reordered = [TOOLS[1], TOOLS[0], TOOLS[2]]
    r = ask(client, msgs, "diag-cmp-b", tools=reordered, extra_body={"cache_compare_with": base.id})
    c = r.model_extra["cache"]
    assert c["compared_with"] == base.id and c["type"] == "tools_changed"
    assert (
        c["detail"]["change"] == "reordered"
        and c["fix"] == "tools were reordered: send them in a stable order"
    )
    opts = {"prompt_cache_options": {"comparison_response_id": base.id}}
    r = ask(client, msgs, "diag-cmp-c", tools=TOOLS, extra_body=opts)
    assert r.model_extra["cache"]["compared_with"] == base.id
    assert r.model_extra["cache"]["type"] is None  # same prefix, served from cache
    r = ask(client, msgs, "diag-cmp-d", tools=TOOLS, extra_body={"cache_compare_with": "chatcmpl-unknown"})
    assert r.model_extra["cache"]["type"] == "unavailable"
