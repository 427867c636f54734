"""RouteRequest: what the router reads from a request's body to place it (server/routing/request.py)."""

from __future__ import annotations

import json

from server.routing.request import assistant_turns, route_request
from server.session_key import HEADER


def test_first_turn_detection_is_conservative():
    # RouteRequest.new_session is what slow start and the graded bound use: a first turn only
    # when the body shows no assistant message at all
    def new_session(body: object) -> bool:
        return route_request(json.dumps(body).encode(), {}, False).new_session

    assert new_session({"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "go"}]})
    assert not new_session(
        {"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}]}
    )
    assert not new_session({"prompt": "hello"})  # completions: no turns to tell, so established
    # the word inside a message's text is JSON-escaped, so it does not count
    assert new_session({"messages": [{"role": "user", "content": 'say "assistant"'}]})
    # a Responses continuation is never a first turn, even with no assistant item in its input
    assert not new_session({"input": "next", "previous_response_id": "resp_x"})


def test_assistant_turns_counts_assistant_messages_only():
    def body(*roles: str, text: str = "x") -> bytes:
        return json.dumps({"messages": [{"role": r, "content": text} for r in roles]}).encode()

    assert assistant_turns(body("system", "user")) == 0
    assert assistant_turns(body("user", "assistant", "tool", "assistant", "tool")) == 2
    assert assistant_turns(body("user", text='the "assistant" said')) == 0  # escaped in JSON: not counted
    assert assistant_turns(b'{"prompt": "hello"}') is None  # completions: the turn is unknown


def test_the_header_fast_path_places_like_the_full_parse():
    # with X-Session-ID and no prompt_cache_key the proxy skips the JSON parse: same placement
    body = json.dumps({"messages": [{"role": "user", "content": "go"}], "user": "u"}).encode()
    headers = {HEADER: "sess-9"}
    fast = route_request(body, headers, with_prefix=False, tenant="team-a")
    full = route_request(body, headers, with_prefix=True, tenant="team-a", salt="ns")
    assert fast.key == full.key and fast.prefix is None and full.prefix is not None
    # the tenant namespaces the key: another tenant's same session lands independently
    assert route_request(body, headers, False, tenant="team-b").key != fast.key
    # prompt_cache_key beats the header, so the fast path is not taken
    keyed = json.dumps({"messages": [], "prompt_cache_key": "pck"}).encode()
    assert route_request(keyed, headers, False).key == route_request(keyed, {}, False).key
