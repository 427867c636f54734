"""Session-key precedence and the prefix hash (what router and worker both derive from a body)."""

from __future__ import annotations

import hashlib
import json

from server.session_key import canonical_json, prefix_hash, response_digest, response_id, session_key

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


# -- the agent clients' sources (issue 23 item 5) ---------------------------------------------------
CC_SESSION = "9f1c2b7e-1111-4222-8333-444455556666"
CC_USER_ID = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": CC_SESSION})


def test_full_precedence_each_source_beats_every_later_one():
    """Every source present; removing the winner hands the key to the next one, in order."""
    resp = "resp_" + "a" * 16 + "b" * 16
    full = body(prompt_cache_key="pck", user="u", metadata={"user_id": CC_USER_ID}, previous_response_id=resp)
    hdrs = {"X-Session-ID": "sid", "X-Claude-Code-Session-Id": "cc-hdr"}
    expected = [
        ("pck", "prompt_cache_key"),
        ("sid", "header"),
        ("cc-hdr", "claude_code_header"),
        (CC_SESSION, "metadata.user_id"),
        ("u", "user"),
        ("resp:" + "a" * 16, "previous_response_id"),
        (prefix_hash(full), "prefix_hash"),
    ]
    b, h = dict(full), dict(hdrs)
    for key, source in expected:
        k = session_key(b, h)
        assert (k.key, k.source) == (key, source)
        {  # drop the winner
            "prompt_cache_key": lambda: b.pop("prompt_cache_key"),
            "header": lambda: h.pop("X-Session-ID"),
            "claude_code_header": lambda: h.pop("X-Claude-Code-Session-Id"),
            "metadata.user_id": lambda: b.pop("metadata"),
            "user": lambda: b.pop("user"),
            "previous_response_id": lambda: b.pop("previous_response_id"),
            "prefix_hash": lambda: None,
        }[source]()


def test_claude_code_header_is_case_insensitive():
    assert session_key({}, {"x-claude-code-session-id": "a"}).source == "claude_code_header"
    assert session_key({}, {"X-CLAUDE-CODE-SESSION-ID": "a"}).key == "a"


def test_metadata_user_id_names_a_session_only_when_it_holds_one():
    k = session_key({"metadata": {"user_id": CC_USER_ID}}, {})
    assert (k.key, k.source) == (CC_SESSION, "metadata.user_id")
    # Claude Code sends the same id in its header: one session whichever source a request has
    assert k.key == session_key({}, {"X-Claude-Code-Session-Id": CC_SESSION}).key
    legacy = f"user_{'e' * 64}_account__session_{CC_SESSION}"  # Claude Code 1.x
    assert session_key({"metadata": {"user_id": legacy}}, {}).key == CC_SESSION
    for user_id in (
        "plain-user",  # an ordinary Anthropic user id: not a session
        json.dumps({"device_id": "x"}),  # JSON without session_id
        json.dumps({"session_id": ""}),
        json.dumps({"session_id": 7}),
        "{not json",
        json.dumps(["session_id"]),
        7,
    ):
        assert session_key({"metadata": {"user_id": user_id}}, {}).source == "prefix_hash", user_id
    assert session_key({"metadata": "x"}, {}).source == "prefix_hash"


def test_previous_response_id_routes_by_the_digest_it_carries():
    turn1 = session_key({"input": "hi", "instructions": "be brief"}, {})
    assert turn1.source == "prefix_hash"
    rid = response_id(turn1)
    assert rid.startswith("resp_") and len(rid) == 5 + 32 and response_digest(rid) == turn1.placement
    turn2 = session_key({"input": "more", "previous_response_id": rid}, {})
    assert turn2.source == "previous_response_id" and turn2.placement == turn1.placement
    # turn 3 chains on turn 2's id: still the same placement
    assert session_key({"previous_response_id": response_id(turn2)}, {}).placement == turn1.placement
    assert turn1.placement == hashlib.sha256(turn1.key.encode()).hexdigest()[:16]
    # ids of another shape name no placement: the next source decides
    for other in ("resp_123", "resp_" + "A" * 32, "msg_" + "a" * 32, "resp_" + "a" * 33):
        assert session_key({"previous_response_id": other}, {}).source == "prefix_hash", other
    assert response_digest("resp_" + "0" * 32) == "0" * 16


MESSAGES_SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328.abc; cc_entrypoint=sdk-cli;"},
    {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "Rules.", "cache_control": {"type": "ephemeral"}},
]
MESSAGES_TOOLS = [{"name": "Read", "input_schema": {"type": "object"}}]


def messages_body(system: object = None, **extra: object) -> dict:
    return {
        "model": "m",
        "system": MESSAGES_SYSTEM if system is None else system,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}]}],
        "tools": MESSAGES_TOOLS,
        **extra,
    }


def test_prefix_hash_of_messages_ignores_the_billing_header_and_cache_control():
    h = prefix_hash(messages_body())
    other_build = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.329.def; cch=1f2e;"},
        *MESSAGES_SYSTEM[1:],
    ]
    assert prefix_hash(messages_body(other_build)) == h  # the per-request line does not split sessions
    no_marks = [{"type": "text", "text": b["text"]} for b in MESSAGES_SYSTEM]
    assert prefix_hash(messages_body(no_marks)) == h  # cache_control moves between turns
    marked_tools = [{**MESSAGES_TOOLS[0], "cache_control": {"type": "ephemeral"}}]
    assert prefix_hash(messages_body(tools=marked_tools)) == h
    later = messages_body()
    later["messages"] = [*later["messages"], {"role": "assistant", "content": "ok"}]
    assert prefix_hash(later) == h
    # a string system with the billing line first hashes as its remaining lines
    as_string = "x-anthropic-billing-header: cc_version=1;\nYou are Claude Code."
    assert prefix_hash(messages_body(as_string)) == prefix_hash(messages_body("You are Claude Code."))
    assert prefix_hash(messages_body([{"type": "text", "text": "You are Claude Code."}])) == prefix_hash(
        messages_body("You are Claude Code.")
    )
    # what the agent is does count
    assert prefix_hash(messages_body([*MESSAGES_SYSTEM[:2], {"type": "text", "text": "Other."}])) != h
    assert prefix_hash(messages_body(tools=[])) != h
    assert prefix_hash({k: v for k, v in messages_body().items() if k != "system"}) != h


def test_prefix_hash_of_responses_covers_instructions_leading_developer_items_and_tools():
    dev = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox"}]}
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "task 1"}]}
    tools = [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]
    base = {"model": "m", "instructions": "You are Codex.", "input": [dev, user], "tools": tools}
    h = prefix_hash(base)
    call = {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"}
    later = {
        **base,
        "input": [dev, user, call, {"type": "function_call_output", "call_id": "c1", "output": "x"}],
    }
    assert prefix_hash(later) == h  # every turn of a session
    assert prefix_hash({**base, "input": [dev, {**user, "content": "task 2"}]}) == h  # every session
    assert prefix_hash({**base, "input": [{"role": "developer", "content": "sandbox"}, user]}) != h
    assert prefix_hash({**base, "instructions": "You are someone else."}) != h
    assert prefix_hash({**base, "input": [{**dev, "content": "other"}, user]}) != h
    assert prefix_hash({**base, "tools": []}) != h
    assert prefix_hash({"model": "m", "input": "hi"}) == prefix_hash({"model": "m", "input": "bye"})


def test_chat_prefix_hash_is_unchanged_by_the_new_dialects():
    """The chat body's hash is what it was before Messages/Responses (routers of both versions agree)."""
    import hashlib as h

    b = body()
    old = (
        "h:"
        + h.sha256(canonical_json({"head": [SYSTEM["content"]], "tools": TOOLS}).encode()).hexdigest()[:24]
    )
    assert prefix_hash(b) == old
