"""Injected causes on agent traces: every miss gets the right type, offset and fix; good turns none.

Traces: tests/fixtures/agent_traces.json (written from the benchmarks' generators by
tests/fixtures/make_agent_traces.py): synthetic agent sessions, two of them with SWE-agent's 29
tools, and the two real SWE-agent trajectories.
Every turn is rendered and tokenized as the server does (embedded tokenizer). The cache
is simulated as holding the previous prompt (cached = its full blocks up to the first
difference), or, for eviction, by the real PrefixCache under a small byte budget.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from server.cache_diag.fingerprint import common_prefix
from server.kvcache.prefix_cache import PrefixCache
from tests.cache_diag.helpers import ENV, SETTINGS, hashed, ideal_cached, prompt, run, tool, trace_bodies

MARK = "⏱ 2026-11-23T07:41:07Z "  # a per-request value; starts with a character no prompt has


@pytest.fixture(scope="module")
def traces() -> list[list[dict[str, Any]]]:
    """Per trace: the request bodies of its turns (good practice: append-only, tools fixed)."""
    return trace_bodies("agents")


def test_good_traces_raise_no_false_alarm(tokenizer, traces):
    turns = 0
    for bodies in traces:
        prompts = [prompt(tokenizer, b["messages"], b["tools"]) for b in bodies]
        for prev, cur in zip(prompts, prompts[1:], strict=False):
            for baseline in (prev, hashed(prev)):
                d = run(baseline, cur, cached=ideal_cached(prev, cur))
                assert d.type is None and d.missed_tokens == 0, d
            # token-granular reuse (a cache that keeps partial blocks): still no alarm
            lcp = common_prefix(prev.ids, cur.ids)
            assert run(prev, cur, cached=min(lcp, len(cur.ids) - 1), block=1).type is None
            turns += 1
    assert turns >= 100


def test_shuffled_argument_keys_are_named_as_a_key_reordering(tokenizer, traces):
    """Tool-call arguments are rendered in the client's key order (as the models' templates
    do): re-serialized keys are a miss, and the report names the message and the reason."""
    named = 0
    for good in trace_bodies("shuffle"):
        # each turn re-serializes every call's arguments in its own random key order
        bodies = [
            {**b, "messages": shuffled_arguments(b["messages"], random.Random(f"{k}"))}
            for k, b in enumerate(good)
        ]
        prompts = [prompt(tokenizer, b["messages"], b["tools"]) for b in bodies]
        for prev, cur in zip(prompts, prompts[1:], strict=False):
            d = run(prev, cur)
            assert d.type is None or (d.type, d.detail.get("change")) == ("messages_changed", "key_order"), d
            if d.type is not None:
                named += 1
                assert "were sent in another order" in d.reason and d.missed_tokens > 0
    assert named > 0


# -- injections ------------------------------------------------------------------------------
Body = dict[str, Any]


def shuffled_arguments(messages: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """The messages with every call's JSON arguments re-serialized in a shuffled key order."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = copy.deepcopy(m)
            for c in m["tool_calls"]:
                args = json.loads(c["function"]["arguments"])
                keys = list(args)
                rng.shuffle(keys)
                c["function"]["arguments"] = json.dumps({k: args[k] for k in keys})
        out.append(m)
    return out


def _with(body: Body, **kw: Any) -> Body:
    out = copy.deepcopy(body)
    out.update(kw)
    return out


def _middle(messages: list[dict[str, Any]], role: str, limit: int) -> int:
    """A message of ``role`` in the middle of the history the previous request already had."""
    idx = [i for i, m in enumerate(messages[: limit - 1]) if m["role"] == role and i > 1]
    return idx[len(idx) // 2]


def inject_system(b: Body, limit: int) -> tuple[Body, dict[str, Any]]:
    msgs = copy.deepcopy(b["messages"])
    msgs[0]["content"] = msgs[0]["content"][:6] + MARK + msgs[0]["content"][6:]
    return _with(b, messages=msgs), {
        "type": "system_changed",
        "character": 6,
        "fix": "character 6 of the system",
    }


def inject_tools_reordered(b: Body, limit: int) -> tuple[Body, dict[str, Any]]:
    tools = list(b["tools"])
    tools[3], tools[7] = tools[7], tools[3]
    name = tools[3]["function"]["name"]
    return _with(b, tools=tools), {
        "type": "tools_changed",
        "change": "reordered",
        "tool": name,
        "fix": "stable order",
    }


def inject_tools_removed(b: Body, limit: int) -> tuple[Body, dict[str, Any]]:
    tools = list(b["tools"])
    gone = tools.pop(5)["function"]["name"]
    return _with(b, tools=tools), {"type": "tools_changed", "change": "removed", "tool": gone, "fix": "mask"}


def inject_tools_added(b: Body, limit: int) -> tuple[Body, dict[str, Any]]:
    tools = list(b["tools"])
    tools.insert(4, tool("zz_new_tool"))
    return _with(b, tools=tools), {
        "type": "tools_changed",
        "change": "added",
        "tool": "zz_new_tool",
        "fix": "mask",
    }


def inject_tools_edited(b: Body, limit: int) -> tuple[Body, dict[str, Any]]:
    tools = copy.deepcopy(b["tools"])
    tools[6]["function"]["description"] = "Updated at 07:41: " + tools[6]["function"].get("description", "")
    name = tools[6]["function"]["name"]
    return _with(b, tools=tools), {"type": "tools_changed", "change": "edited", "tool": name, "fix": name}


def inject_message_edited(b: Body, limit: int) -> tuple[Body, dict[str, Any]]:
    msgs = copy.deepcopy(b["messages"])
    j = _middle(msgs, "tool", limit)
    msgs[j]["content"] = msgs[j]["content"][:10] + MARK + msgs[j]["content"][10:]
    at = len(ENV.tool_response_open) + 10
    return _with(b, messages=msgs), {
        "type": "messages_changed",
        "message": j,
        "change": "edited",
        "character": at,
        "fix": f"character {at}",
    }


def inject_message_removed(b: Body, limit: int) -> tuple[Body, dict[str, Any]]:
    msgs = copy.deepcopy(b["messages"])
    j = _middle(msgs, "assistant", limit)
    count = 2 if msgs[j + 1]["role"] == "tool" else 1
    del msgs[j : j + count]
    return _with(b, messages=msgs), {
        "type": "messages_changed",
        "message": j,
        "change": "removed",
        "fix": "append-only",
    }


def inject_message_inserted(b: Body, limit: int) -> tuple[Body, dict[str, Any]]:
    msgs = copy.deepcopy(b["messages"])
    j = _middle(msgs, "assistant", limit)
    msgs.insert(j, {"role": "user", "content": "Reminder: keep the diff small."})
    return _with(b, messages=msgs), {
        "type": "messages_changed",
        "message": j,
        "change": "inserted",
        "fix": "at the end",
    }


INJECTIONS: dict[str, Callable[[Body, int], tuple[Body, dict[str, Any]]]] = {
    "system": inject_system,
    "tools_reordered": inject_tools_reordered,
    "tools_removed": inject_tools_removed,
    "tools_added": inject_tools_added,
    "tools_edited": inject_tools_edited,
    "message_edited": inject_message_edited,
    "message_removed": inject_message_removed,
    "message_inserted": inject_message_inserted,
}


def _turn_pairs(traces: list[list[Body]]) -> list[tuple[Body, Body]]:
    """(previous, current) request bodies: two turns per trace, late enough to have history."""
    out = []
    for bodies in traces:
        for k in (len(bodies) // 2, len(bodies) - 2):
            out.append((bodies[k - 1], bodies[k]))
    return out


def _check(d: Any, want: dict[str, Any], exact: bool) -> None:
    assert d.type == want["type"], (want, d)
    for key in ("change", "tool", "message"):
        if key in want:
            assert d.detail[key] == want[key], (key, want, d.detail)
    if "character" in want:
        if exact:
            assert d.detail["character"] == want["character"], d.detail
        else:  # from hashes alone: the start of the first differing token
            assert 0 <= want["character"] - d.detail["character"] < 8, d.detail
    if exact:
        assert want["fix"] in d.fix, d.fix
    assert d.fix and d.missed_tokens > 0


@pytest.mark.parametrize("kind", sorted(INJECTIONS))
def test_injected_change_is_named(tokenizer, traces, kind):
    for prev_body, body in _turn_pairs(traces):
        cur_body, want = INJECTIONS[kind](body, len(prev_body["messages"]))
        prev = prompt(tokenizer, prev_body["messages"], prev_body["tools"])
        cur = prompt(tokenizer, cur_body["messages"], cur_body["tools"])
        exact = run(prev, cur)
        _check(exact, want, exact=True)
        assert prev.ids[: exact.diverged_at_token] == cur.ids[: exact.diverged_at_token]
        assert prev.ids[exact.diverged_at_token] != cur.ids[exact.diverged_at_token]
        fp_only = run(hashed(prev), cur, cached=ideal_cached(prev, cur))
        _check(fp_only, want, exact=False)
        assert fp_only.diverged_at_token == exact.diverged_at_token


def test_template_rewrite_settings_model_and_expiry_on_traces(tokenizer, traces):
    for prev_body, body in _turn_pairs(traces):
        prev = prompt(tokenizer, prev_body["messages"], prev_body["tools"])
        # the template renders an earlier assistant turn without its text (as Qwen3 drops reasoning)
        shown = copy.deepcopy(body["messages"])
        j = next(i for i, m in enumerate(shown) if m["role"] == "assistant" and m.get("content"))
        shown[j]["content"] = ""
        cur = prompt(tokenizer, body["messages"], body["tools"], rendered_messages=shown)
        d = run(prev, cur)
        assert d.type == "template_rewrote_history" and d.detail["segment"] == f"message {j} (assistant)", d
        same = prompt(tokenizer, body["messages"], body["tools"])
        other_ns = prompt(
            tokenizer, body["messages"], body["tools"], settings={**SETTINGS, "cache_namespace": "b"}
        )
        assert run(prev, other_ns, cached=0).type == "settings_changed"
        assert run(prev, prompt(tokenizer, body["messages"], body["tools"], model="x"), cached=0).type == (
            "model_changed"
        )
        d = run(prev, same, cached=0, idle=900.0, retention_s=600.0)
        assert d.type == "expired" and d.detail["idle_seconds"] == 900.0


def test_eviction_under_memory_pressure_is_named_evicted(tokenizer, traces):
    """Sessions interleaved through the real PrefixCache with room for ~1.5 sessions: only evictions."""
    block = 32
    cache = PrefixCache(block, capacity_bytes=48 * 30)  # 48 blocks of "30 bytes"
    sessions = [[prompt(tokenizer, b["messages"], b["tools"]) for b in bodies[:10]] for bodies in traces[:4]]
    misses = clean = 0
    for k in range(1, 10):
        for turns in sessions:
            prev, cur = turns[k - 1], turns[k]
            ids = list(cur.ids)
            cached = cache.match(ids, max_blocks=(len(ids) - 1) // block).cached_tokens
            cache.insert(ids, "", lambda i: (i, 30))
            d = run(prev, cur, cached=cached, idle=3.0)
            if d.type is None:
                clean += 1
                continue
            misses += 1
            reusable = (min(prev.fp.core_tokens, len(ids) - 1) // block) * block
            assert d.type == "evicted" and d.missed_tokens == reusable - cached, d
            assert d.detail["idle_seconds"] == 3.0 and d.diverged_at_token is None
    assert misses >= 5 and cache.evictions > 0
