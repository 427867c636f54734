"""Keys at the edge: the router authenticates, namespaces sessions by tenant, passes the tenant on."""

from __future__ import annotations

import httpx
import pytest

from server.auth import TENANT_HEADER, TOKEN_HEADER, authenticate, namespaced_session
from server.config import AuthSettings, RoutingSettings, Settings
from server.errors import Unauthorized
from server.routing.request import RouteRequest
from server.session_key import key_digest, prefix_hash
from tests.routing.conftest import RouterThread

pytestmark = pytest.mark.timeout(60)
KEYS = {"team-a": "key-a", "team-b": "key-b"}


def chat(key: str) -> dict:
    return {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "prompt_cache_key": key}


@pytest.fixture
def edge_router(workers):
    started: list[RouterThread] = []

    def make(**auth: object) -> RouterThread:
        settings = Settings(
            auth=AuthSettings(api_keys=KEYS, **auth),
            routing=RoutingSettings(health_interval_s=0.2, health_failures=1),
        )
        r = RouterThread(settings, [w.url for w in workers]).start()
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()


def post(r: RouterThread, body: dict, key: str | None = None, **headers: str) -> httpx.Response:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(r.url + "/v1/chat/completions", json=body, headers=headers, timeout=10)


def all_logs(workers) -> list[dict]:
    return [rec for w in workers for rec in w.log()]


def test_bad_or_missing_key_is_a_401_at_the_router_and_no_worker_sees_it(workers, edge_router):
    r = edge_router()
    for key in (None, "wrong", "key-a "[:4]):
        resp = post(r, chat("s"), key)
        assert resp.status_code == 401, resp.text
        assert resp.json()["error"]["type"] == "authentication_error"
        assert "x-agentserve-worker" not in resp.headers
    assert all_logs(workers) == []
    assert post(r, chat("s"), "key-a").status_code == 200
    assert len(all_logs(workers)) == 1


def test_without_router_token_no_tenant_header_reaches_the_worker_even_if_the_client_sends_one(
    workers, edge_router
):
    r = edge_router()
    resp = post(r, chat("s"), "key-a", **{"X-Agentserve-Tenant": "team-b", "X-Agentserve-Router-Token": "x"})
    assert resp.status_code == 200
    (rec,) = all_logs(workers)
    assert rec["tenant"] is None and rec["router_token"] is None  # stripped; the worker checks the key


def test_with_router_token_the_worker_gets_the_authenticated_tenant_not_the_spoofed_one(workers, edge_router):
    r = edge_router(router_token="shared-secret")
    resp = post(
        r, chat("s"), "key-a", **{"X-Agentserve-Tenant": "team-b", "X-Agentserve-Router-Token": "forged"}
    )
    assert resp.status_code == 200
    (rec,) = all_logs(workers)
    assert (rec["tenant"], rec["router_token"]) == ("team-a", "shared-secret")


def test_two_tenants_with_the_same_session_key_are_placed_independently(workers, edge_router):
    r = edge_router()
    policy, pool = r.router.policy, r.router.pool

    def home(tenant: str, key: str) -> str:
        placement = key_digest(namespaced_session(tenant, key))  # the router places by the key's digest
        sel = policy.select_worker(RouteRequest(placement, prefix_hash(chat(key)), 0), pool.loads())
        return pool.workers[sel.worker].url

    keys = [k for k in (f"shared-{i}" for i in range(60)) if home("team-a", k) != home("team-b", k)][:5]
    assert len(keys) == 5
    for k in keys:
        a = post(r, chat(k), "key-a").headers["x-agentserve-worker"]
        b = post(r, chat(k), "key-b").headers["x-agentserve-worker"]
        assert (a, b) == (home("team-a", k), home("team-b", k))


def test_router_metrics_and_workers_need_a_key_when_protected(workers, edge_router):
    open_r = edge_router()
    assert httpx.get(open_r.url + "/metrics", timeout=5).status_code == 200
    r = edge_router(protect_metrics=True)
    for path in ("/metrics", "/workers", "/metrics/worker/0"):
        assert httpx.get(r.url + path, timeout=5).status_code == 401, path
        ok = httpx.get(r.url + path, headers={"Authorization": "Bearer key-b"}, timeout=5)
        assert ok.status_code == 200, path
    assert httpx.get(r.url + "/health", timeout=5).status_code == 200  # always open


def test_worker_trusts_the_tenant_header_only_with_the_router_token():
    auth = AuthSettings(api_keys=KEYS, router_token="tok")
    assert authenticate({TENANT_HEADER: "team-b", TOKEN_HEADER: "tok"}, auth) == "team-b"
    assert authenticate({"authorization": "Bearer key-a"}, auth) == "team-a"  # direct clients: their key
    for headers in (
        {TENANT_HEADER: "team-b"},
        {TENANT_HEADER: "team-b", TOKEN_HEADER: "tok2"},
        {TENANT_HEADER: "team-b", TOKEN_HEADER: "", "authorization": "Bearer key-b"},
        {TOKEN_HEADER: "to"},
    ):
        with pytest.raises(Unauthorized):
            authenticate(headers, auth)
    # no router token configured: a tenant header is never trusted, even with a valid key
    with pytest.raises(Unauthorized, match="only from the router"):
        authenticate({TENANT_HEADER: "team-a", "authorization": "Bearer key-a"}, AuthSettings(api_keys=KEYS))


def test_x_api_key_authenticates_like_bearer():
    """Anthropic clients (Claude Code) send x-api-key; a Bearer header, when valid, wins."""
    auth = AuthSettings(api_keys=KEYS)
    assert authenticate({"x-api-key": "key-b"}, auth) == "team-b"
    assert authenticate({"x-api-key": " key-b "}, auth) == "team-b"
    assert authenticate({"authorization": "Bearer key-a", "x-api-key": "key-b"}, auth) == "team-a"
    assert authenticate({"authorization": "Basic xyz", "x-api-key": "key-b"}, auth) == "team-b"
    for headers in (
        {"x-api-key": "nope"},
        {"x-api-key": ""},
        {},
        {"authorization": "Bearer ", "x-api-key": " "},
    ):
        with pytest.raises(Unauthorized):
            authenticate(headers, auth)
    with pytest.raises(Unauthorized, match="x-api-key"):
        authenticate({}, auth)
    assert authenticate({"x-api-key": "anything"}, AuthSettings()) == ""  # no keys configured: open
