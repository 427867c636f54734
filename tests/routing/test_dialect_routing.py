"""The router in front of the agent dialects: /v1/messages (+ count_tokens, ?beta=true) and /v1/responses
are proxied and placed by session like chat; Anthropic's x-api-key is checked at the edge."""

from __future__ import annotations

import json

import httpx
import pytest

from server.auth import namespaced_session
from server.config import AuthSettings, RoutingSettings, Settings
from server.routing.request import RouteRequest
from server.session_key import SessionKey, key_digest, prefix_hash, response_id
from tests.routing.conftest import RouterThread

pytestmark = pytest.mark.timeout(60)
BILLING = "x-anthropic-billing-header: cc_version=2.1.328.{}; cc_entrypoint=sdk-cli;"


def messages(system: str = "You are Claude Code.", billing: str = "a1", **extra: object) -> dict:
    return {
        "model": "fake",
        "max_tokens": 3,
        "system": [{"type": "text", "text": BILLING.format(billing)}, {"type": "text", "text": system}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
        **extra,
    }


def responses(instructions: str = "You are Codex.", **extra: object) -> dict:
    return {"model": "fake", "max_output_tokens": 3, "instructions": instructions, "input": "hi", **extra}


def post(r: RouterThread, path: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(r.url + path, json=body, headers=headers, timeout=10)


def worker_of(resp: httpx.Response) -> str:
    assert resp.status_code == 200, resp.text
    return resp.headers["x-agentserve-worker"]


def home(r: RouterThread, key: str, body: dict, tenant: str = "") -> str:
    """Where the policy puts the session ``key`` (namespaced by tenant, placed by its digest)."""
    first_turn = RouteRequest(key_digest(namespaced_session(tenant, key)), prefix_hash(body), 0)
    sel = r.router.policy.select_worker(first_turn, r.router.pool.loads())
    return r.router.pool.workers[sel.worker].url


def spread_keys(r: RouterThread, body: dict, n: int = 3) -> list[str]:
    """n keys whose homes differ from the prefix hash's home (so a router that ignored them is caught),
    taken in turn from each such home: worker ports are random, so the first n keys by name could
    all share one home and a router that sent every key to one worker would pass."""
    fallback = home(r, prefix_hash(body), body)
    by_home: dict[str, list[str]] = {}
    for k in (f"k-{i}" for i in range(200)):
        if (h := home(r, k, body)) != fallback:
            by_home.setdefault(h, []).append(k)
    keys = [k for group in zip(*by_home.values(), strict=False) for k in group][:n]
    assert len(keys) == n and len({home(r, k, body) for k in keys}) == min(n, len(by_home))
    return keys


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages?beta=true", "/v1/messages/count_tokens"])
def test_messages_paths_are_proxied_with_their_query(workers, make_router, path):
    r = make_router([w.url for w in workers])
    resp = post(r, path, messages())
    worker = worker_of(resp)
    rec = next(rec for w in workers if w.url == worker for rec in w.log())
    assert rec["path"] == path.split("?")[0] and rec["query"] == (path.split("?") + [""])[1]


def test_messages_are_placed_by_the_claude_code_session(workers, make_router):
    r = make_router([w.url for w in workers])
    body = messages()
    for sid in spread_keys(r, body):
        user_id = json.dumps({"device_id": "d", "session_id": sid})
        want = home(r, sid, body)
        assert worker_of(post(r, "/v1/messages", body, **{"X-Claude-Code-Session-Id": sid})) == want
        # the session in metadata.user_id alone, and count_tokens, land on the same worker
        assert worker_of(post(r, "/v1/messages", {**body, "metadata": {"user_id": user_id}})) == want
        counted = post(r, "/v1/messages/count_tokens?beta=true", body, **{"X-Claude-Code-Session-Id": sid})
        assert worker_of(counted) == want
    for w in workers:  # the worker derives the same session from the same request
        assert {rec["source"] for rec in w.log()} <= {"claude_code_header", "metadata.user_id"}


def test_messages_without_a_session_keep_their_worker_whatever_the_billing_line(workers, make_router):
    r = make_router([w.url for w in workers])
    seen = set()
    for agent in range(12):
        body = messages(system=f"You are agent {agent}.")
        where = {
            worker_of(post(r, "/v1/messages", messages(f"You are agent {agent}.", f"b{i}"))) for i in range(3)
        }
        assert where == {home(r, prefix_hash(body), body)}
        seen |= where
    assert len(seen) > 1  # the prefix hash spreads agents: the check above could fail


def test_responses_are_placed_by_prompt_cache_key_and_session_headers(workers, make_router):
    r = make_router([w.url for w in workers])
    body = responses()
    for key in spread_keys(r, body):
        assert worker_of(post(r, "/v1/responses", {**body, "prompt_cache_key": key})) == home(r, key, body)
        assert worker_of(post(r, "/v1/responses", body, **{"X-Session-ID": key})) == home(r, key, body)


def test_a_turn_keyed_only_by_previous_response_id_lands_on_its_sessions_worker(workers, make_router):
    """Turn 1 has no session key (placed by its prefix hash); turn 2 names only the response turn 1
    got (its id carries the session's digest, as the Responses adapter writes it)."""
    r = make_router([w.url for w in workers])
    homes = set()
    for s in range(15):
        turn1 = responses(instructions=f"You are Codex #{s}.")
        w1 = worker_of(post(r, "/v1/responses", turn1))
        rid = response_id(SessionKey(prefix_hash(turn1), "prefix_hash"))  # what the worker would answer
        turn2 = {"model": "fake", "input": [{"role": "user", "content": "next"}], "previous_response_id": rid}
        assert worker_of(post(r, "/v1/responses", turn2)) == w1
        rid2 = response_id(SessionKey("resp:" + rid[5:21], "previous_response_id", rid[5:21]))
        turn3 = {**turn2, "previous_response_id": rid2}
        assert worker_of(post(r, "/v1/responses", turn3)) == w1
        homes.add(w1)
    assert len(homes) > 1
    for w in workers:
        assert {rec["source"] for rec in w.log()} == {"prefix_hash", "previous_response_id"} or not w.log()


KEYS = {"team-a": "key-a", "team-b": "key-b"}


@pytest.fixture
def keyed_router(workers):
    settings = Settings(
        auth=AuthSettings(api_keys=KEYS), routing=RoutingSettings(health_interval_s=0.2, health_failures=1)
    )
    r = RouterThread(settings, [w.url for w in workers]).start()
    yield r
    r.stop()


def test_x_api_key_is_checked_at_the_router(workers, keyed_router):
    r = keyed_router
    for headers in ({}, {"x-api-key": "wrong"}, {"x-api-key": ""}, {"Authorization": "Bearer wrong"}):
        resp = post(r, "/v1/messages", messages(), **headers)
        assert resp.status_code == 401, (headers, resp.text)
        assert "x-agentserve-worker" not in resp.headers
        # the router's own errors take the dialect's shape: Anthropic's on /v1/messages
        assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "authentication_error"
    openai_shaped = post(r, "/v1/responses", responses()).json()
    assert openai_shaped["error"]["type"] == "authentication_error" and "type" not in openai_shaped
    assert all(not w.log() for w in workers)
    assert post(r, "/v1/messages?beta=true", messages(), **{"x-api-key": "key-a"}).status_code == 200
    assert post(r, "/v1/responses", responses(), **{"Authorization": "Bearer key-b"}).status_code == 200
    # a valid Bearer wins over a stale x-api-key; the key names the tenant the session is placed for
    body = messages()
    key = next(
        k for k in (f"t-{i}" for i in range(80)) if home(r, k, body, "team-a") != home(r, k, body, "team-b")
    )
    hdr = {"X-Claude-Code-Session-Id": key}
    assert worker_of(post(r, "/v1/messages", body, **hdr, **{"x-api-key": "key-a"})) == home(
        r, key, body, "team-a"
    )
    both = {"x-api-key": "wrong", "Authorization": "Bearer key-b"}
    assert worker_of(post(r, "/v1/messages", body, **hdr, **both)) == home(r, key, body, "team-b")


def test_turns_of_messages_and_responses_bodies():
    """The turn (slow start, graded load bound) from the body alone, in the new dialects too."""
    from server.routing.request import assistant_turns

    def enc(body: dict) -> bytes:
        return json.dumps(body).encode()

    assert assistant_turns(enc(messages())) == 0
    later = messages()
    later["messages"] += [
        {"role": "assistant", "content": [{"type": "tool_use"}]},
        {"role": "user", "content": "r"},
    ]
    assert assistant_turns(enc(later)) == 1
    assert assistant_turns(enc(responses())) == 0
    call = {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"}
    out = {"type": "function_call_output", "call_id": "c", "output": "x"}
    assert assistant_turns(enc({**responses(), "input": [{"role": "user", "content": "go"}, call, out]})) == 1
    assert assistant_turns(enc({"model": "m", "input": "next", "previous_response_id": "resp_x"})) == 1
