"""Session-key precedence and the prefix hash (what router and worker both derive from a body)."""

from __future__ import annotations

from server.session_key import prefix_hash, session_key

SYSTEM = {"role": "system", "content": "You are a browser agent."}
TOOLS = [{"type": "function", "function": {"name": "browser_open", "parameters": {"type": "object"}}}]


def body(**extra: object) -> dict:
    return {"messages": [SYSTEM, {"role": "user", "content": "go"}], "tools": TOOLS, **extra}


def test_prompt_cache_key_beats_header_beats_user_beats_prefix_hash():
    hdr = {"X-Session-ID": "from-header"}
    k = session_key(body(prompt_cache_key="pck", user="u"), hdr)
    assert (k.key, k.source) == ("pck", "prompt_cache_key")
    k = session_key(body(user="u"), hdr)
    assert (k.key, k.source) == ("from-header", "header")
    k = session_key(body(user="u"), {})
    assert (k.key, k.source) == ("u", "user")
    k = session_key(body(), {})
    assert (k.key, k.source) == (prefix_hash(body()), "prefix_hash")


def test_header_name_is_case_insensitive_and_empty_values_fall_through():
    assert session_key(body(), {"x-session-id": "a"}).key == "a"
    assert session_key(body(), {"X-SESSION-ID": "a"}).key == "a"
    # empty or non-string values are not keys: the next source decides
    assert session_key(body(prompt_cache_key="", user="u"), {"X-Session-ID": ""}).source == "user"
    assert session_key(body(prompt_cache_key=7, user=["x"]), {}).source == "prefix_hash"


def test_prefix_hash_covers_system_messages_and_tools_only():
    h = prefix_hash(body())
    later_turn = body()
    later_turn["messages"] = [
        *later_turn["messages"],
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "more"},
    ]
    assert prefix_hash(later_turn) == h  # same on every turn of a session
    other_task = body()
    other_task["messages"] = [SYSTEM, {"role": "user", "content": "a different task"}]
    assert prefix_hash(other_task) == h  # shared by every session of the agent
    assert prefix_hash({**body(), "tools": TOOLS[:0]}) != h
    changed = body()
    changed["messages"] = [{"role": "system", "content": "You are a shell agent."}, *changed["messages"][1:]]
    assert prefix_hash(changed) != h
    # key order inside a tool does not matter (canonical JSON)
    reordered = [{"function": {"parameters": {"type": "object"}, "name": "browser_open"}, "type": "function"}]
    assert prefix_hash({**body(), "tools": reordered}) == h
    assert prefix_hash({"prompt": "abc"}) != prefix_hash({"prompt": "abd"})
