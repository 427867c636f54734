"""The synthetic agent-trace generator: determinism, tools, budgets, shape of a session."""

from __future__ import annotations

import json

from benchmarks.harness.agent_tools import PREFIXES, agent_tools
from benchmarks.harness.trace_gen import BUDGET_MARGIN, approx_tokens, generate_session, generate_sessions


def test_same_seed_same_bytes_other_seed_differs():
    a = generate_session(7, 0)
    b = generate_session(7, 0)
    assert json.dumps(a.messages) == json.dumps(b.messages)
    assert a.turns == b.turns and a.notes == b.notes
    assert json.dumps(generate_session(8, 0).messages) != json.dumps(a.messages)
    assert json.dumps(generate_session(7, 1).messages) != json.dumps(a.messages)


def test_tools_are_at_least_20_with_prefixes_and_valid_schemas():
    tools = agent_tools()
    names = [t["function"]["name"] for t in tools]
    assert len(tools) >= 20 and len(set(names)) == len(names)
    for p in PREFIXES:
        assert sum(n.startswith(p) for n in names) >= 5
    for t in tools:
        params = t["function"]["parameters"]
        assert params["type"] == "object"
        assert set(params.get("required", [])) <= set(params["properties"])
        assert t["function"]["description"]


def test_session_shape_system_task_then_call_observation_steps():
    s = generate_session(0, 0, context=131072)
    assert s.messages[0]["role"] == "system" and s.messages[1]["role"] == "user"
    assert len(s.turns) == 50  # a 128k budget fits all steps
    for turn in s.turns:
        reply = s.messages[turn.end]
        assert reply["role"] == "assistant" and len(reply["tool_calls"]) == 1
        assert turn.phase in PREFIXES
        obs = s.messages[turn.end + 1]
        assert obs["role"] == "tool" and obs["tool_call_id"] == reply["tool_calls"][0]["id"]
        json.loads(reply["tool_calls"][0]["function"]["arguments"])
    assert [t.index for t in s.turns] == list(range(1, 51))
    # occasional new user messages between steps
    sessions = generate_sessions(0, 5, context=131072)
    users = sum(1 for s in sessions for m in s.messages[2:] if m["role"] == "user")
    assert users >= 1


def test_observation_sizes_at_full_scale_and_prompt_to_output_ratio():
    s = generate_session(3, 0, context=131072)
    obs = [approx_tokens(m["content"]) for m in s.messages if m["role"] == "tool"]
    assert s.meta["scale"] == 1.0
    assert min(obs) >= 60 and max(obs) <= 2100
    calls = [
        approx_tokens(m["tool_calls"][0]["function"]["arguments"]) for m in s.messages if m.get("tool_calls")
    ]
    prompt_total = sum(s.est_tokens * t.index / len(s.turns) for t in s.turns)  # prompts grow ~linearly
    assert prompt_total / sum(calls) > 50


def test_budget_respected_with_estimate_and_with_exact_counter():
    for context in (4096, 8192, 16384):
        s = generate_session(1, 0, context=context)
        assert s.est_tokens <= (context - 256) * BUDGET_MARGIN
    sizes = []

    def exact(messages, tools):  # a stand-in for the server's template + tokenizer
        n = sum(approx_tokens(json.dumps(m)) for m in messages) + sum(
            approx_tokens(json.dumps(t)) for t in tools
        )
        sizes.append(n)
        return n

    s = generate_session(1, 0, context=8192, prompt_tokens=exact)
    assert s.est_tokens <= 8192 - 256
    assert exact(s.messages, s.tools) <= 8192 - 256


def test_small_context_stops_deterministically_and_says_so():
    s = generate_session(2, 0, context=4096, steps=50)
    assert len(s.turns) < 50
    assert "stopped before step" in s.notes and s.meta["stopped"]
    assert generate_session(2, 0, context=4096, steps=50).notes == s.notes
