"""The router over fake worker processes: proxying, affinity, streaming, cancellation, failure."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest

from server import __version__
from server.routing.request import RouteRequest
from server.session_key import key_digest, prefix_hash
from tests.routing.conftest import spawn_fake_workers, stop_fake_workers

pytestmark = pytest.mark.timeout(60)


def chat(key: str, stream: bool = False, **extra: object) -> dict:
    return {
        "model": "fake",
        "messages": [{"role": "user", "content": f"hello from {key}"}],
        "prompt_cache_key": key,
        "stream": stream,
        **extra,
    }


def post(router, body: dict, timeout: float = 10.0, **kw) -> httpx.Response:
    return httpx.post(router.url + "/v1/chat/completions", json=body, timeout=timeout, **kw)


def metric(router, name: str, **labels: str) -> float:
    text = httpx.get(router.url + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def sse_events(lines: list[str]) -> list[str]:
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


def home_of(router, key: str) -> str:
    return expected_home(router, key, chat(key))


def test_json_proxied_with_worker_header(workers, make_router):
    r = make_router([w.url for w in workers])
    resp = post(r, chat("s1"))
    assert resp.status_code == 200
    body = resp.json()
    worker_id = resp.headers["x-agentserve-worker"]
    assert worker_id == next(w.url for w in workers if w.id == body["system_fingerprint"])
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert "cache" in body
    models = httpx.get(r.url + "/v1/models", timeout=5)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "fake"
    assert "x-agentserve-worker" in models.headers


def test_worker_4xx_passed_through_unchanged(workers, make_router):
    r = make_router([w.url for w in workers])
    direct = httpx.post(workers[0].url + "/v1/chat/completions", json=chat("s", model="missing"), timeout=5)
    via = post(r, chat("s", model="missing"))
    assert via.status_code == direct.status_code == 404
    assert via.json() == direct.json()
    assert "x-agentserve-worker" in via.headers


def test_a_router_bug_on_the_proxy_path_is_an_openai_shaped_500(workers, make_router, monkeypatch):
    import server.routing.router_app as router_module

    async def broken(*args: object) -> None:
        raise RuntimeError("boom")

    r = make_router([w.url for w in workers])
    monkeypatch.setattr(router_module, "proxy_request", broken)
    resp = post(r, chat("s-bug"))
    assert resp.status_code == 500
    err = resp.json()["error"]
    assert err["type"] == "server_error" and "internal router error" in err["message"]
    assert "boom" not in err["message"]  # internals stay in the router's log
    assert httpx.get(r.url + "/health", timeout=5).status_code == 200  # the rest of the app is untouched


@pytest.mark.parametrize("upstream", ["raw", "aiohttp", "httpx"])
def test_sequential_requests_reuse_one_upstream_connection(workers, make_router, upstream):
    """Keep-alive to the worker: one connection for a run of sequential requests (JSON and SSE),
    not a new TCP connection per request."""
    r = make_router([workers[0].url], upstream=upstream)
    for i in range(6):
        resp = post(r, chat("s", stream=bool(i % 2)))
        assert resp.status_code == 200
    peers = [rec["peer"] for rec in workers[0].log()]
    assert len(peers) == 6 and len(set(peers)) == 1, peers


def test_every_turn_of_a_session_lands_on_one_worker(workers, make_router):
    r = make_router([f"{w.id}={w.url}" for w in workers])
    seen: dict[str, set[str]] = {}
    for _turn in range(3):
        for s in range(12):
            resp = post(r, chat(f"sess-{s}"))
            seen.setdefault(f"sess-{s}", set()).add(resp.headers["x-agentserve-worker"])
    assert all(len(ids) == 1 for ids in seen.values()), seen
    assert len(set().union(*seen.values())) > 1  # sessions spread over workers
    # the worker saw the same session key the router routed by
    for w in workers:
        assert {rec["session"] for rec in w.log()} == {k for k, ids in seen.items() if ids == {w.id}}
    assert metric(r, "agentserve_router_affinity_total", outcome="kept") == 36


def expected_home(router, key: str, body: dict) -> str:
    """Where the policy puts session ``key`` (given explicitly, not via the router's key logic: the
    router places a session by its key's digest)."""
    first_turn = RouteRequest(key_digest(key), prefix_hash(body), 0)
    sel = router.router.policy.select_worker(first_turn, router.router.pool.loads())
    return router.router.pool.workers[sel.worker].id


def test_session_key_precedence_decides_the_worker(workers, make_router):
    # each case picks keys whose worker differs from what the next-lower source would give, so
    # a router that ignored the source (or the precedence) would land elsewhere
    r = make_router([w.url for w in workers])
    body = {
        "model": "fake",
        "messages": [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "go"}],
    }
    fallback = expected_home(r, prefix_hash(body), body)

    def where(b: dict, **headers: str) -> set[str]:
        return {post(r, b, headers=headers).headers["x-agentserve-worker"] for _ in range(2)}

    hdrs = [k for k in (f"hdr-{i}" for i in range(60)) if expected_home(r, k, body) != fallback][:3]
    users = [k for k in (f"u-{i}" for i in range(60)) if expected_home(r, k, body) != fallback][:3]
    assert len(hdrs) == len(users) == 3
    for k in hdrs:
        assert where(body, **{"X-Session-ID": k}) == {expected_home(r, k, body)}
    for k in users:
        assert where({**body, "user": k}) == {expected_home(r, k, body)}
    # prompt_cache_key > X-Session-ID > user: pairs whose two keys have different workers
    pairs = [
        (a, b)
        for a in (f"p-{i}" for i in range(40))
        for b in hdrs
        if expected_home(r, a, body) != expected_home(r, b, body)
    ][:3]
    for pk, hk in pairs:
        assert where({**body, "prompt_cache_key": pk}, **{"X-Session-ID": hk}) == {expected_home(r, pk, body)}
    # drawn from all candidates, not the three above: those may all sit on one worker (ports are random)
    hdr_home = {k: expected_home(r, k, body) for k in (f"hdr-{i}" for i in range(60))}
    user_home = {k: expected_home(r, k, body) for k in (f"u-{i}" for i in range(60))}
    pairs = [
        (h, u)
        for h, hw in hdr_home.items()
        for u, uw in user_home.items()
        if fallback != hw != uw != fallback
    ][:3]
    assert len(pairs) == 3
    for hk, uk in pairs:
        assert where({**body, "user": uk}, **{"X-Session-ID": hk}) == {expected_home(r, hk, body)}
    # no key at all: the prefix hash, stable while the conversation grows behind the same head
    for turn in range(3):
        more = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "x"}] * turn
        assert where({**body, "messages": body["messages"] + more}) == {fallback}


def test_two_router_replicas_route_every_session_identically(workers, make_router):
    urls = [w.url for w in workers]
    r1 = make_router(urls)
    r2 = make_router(list(reversed(urls)))  # another replica, workers listed in another order
    for s in range(30):
        key = f"replica-{s}"
        w1 = post(r1, chat(key)).headers["x-agentserve-worker"]
        w2 = post(r2, chat(key)).headers["x-agentserve-worker"]
        assert w1 == w2, key


def test_stream_is_relayed_chunk_by_chunk(workers, make_router):
    for w in workers:
        w.configure(chunks=5, chunk_delay_s=0.3)
    r = make_router([w.url for w in workers])
    t0 = time.monotonic()
    arrivals: list[tuple[float, str]] = []
    with httpx.stream(
        "POST", r.url + "/v1/chat/completions", json=chat("stream-1", stream=True), timeout=10
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        worker = next(w for w in workers if w.url == resp.headers["x-agentserve-worker"])
        for line in resp.iter_lines():
            if line.startswith("data: "):
                if not arrivals:
                    # the worker has not finished generating when the first chunk reaches the client
                    assert worker.log()[-1]["completed"] is False
                arrivals.append((time.monotonic() - t0, line))
    events = [line for _, line in arrivals]
    assert events[-1] == "data: [DONE]"
    assert len(events) == 7  # 5 deltas + usage chunk + [DONE]
    assert json.loads(events[-2][6:])["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # the first chunk reached the client before the worker had finished (checked above, from the
    # worker's own record, not a clock); the rest came as the worker produced them: its 4 pauses of
    # 0.3 s lie between the first and the last arrival (a lower bound: load only makes it longer)
    assert arrivals[-1][0] - arrivals[0][0] > 1.0


def test_client_disconnect_cancels_the_upstream_request(workers, make_router):
    for w in workers:
        w.configure(chunks=600, chunk_delay_s=0.1)  # a minute of stream: it cannot finish on its own here
    r = make_router([w.url for w in workers])
    with httpx.stream(
        "POST", r.url + "/v1/chat/completions", json=chat("cancel-me", stream=True), timeout=10
    ) as resp:
        worker = next(w for w in workers if w.url == resp.headers["x-agentserve-worker"])
        for line in resp.iter_lines():
            if line.startswith("data: "):
                break  # hang up after the first chunk
    deadline = time.monotonic() + 30  # bounds the wait only
    while time.monotonic() < deadline:
        rec = worker.log()[-1]
        if rec["cancelled"]:
            break
        time.sleep(0.1)
    assert rec["cancelled"] and not rec["completed"] and rec["chunks_sent"] < 600, rec
    deadline = time.monotonic() + 30
    while (
        r.router.pool.workers[0].in_flight + sum(w.in_flight for w in r.router.pool.workers)
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert all(w["in_flight"] == 0 for w in httpx.get(r.url + "/workers", timeout=5).json()["workers"])


@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_before_the_first_byte_cancels_upstream(workers, make_router, stream):
    workers_by_url = {w.url: w for w in workers}
    for w in workers:
        w.configure(delay_s=60.0)  # a long prefill: nothing comes back for a minute
    r = make_router([w.url for w in workers])
    worker = workers_by_url[home_of(r, "leaver")]
    with pytest.raises(httpx.ReadTimeout):
        post(r, chat("leaver", stream=stream), timeout=0.5)  # the client gives up and hangs up
    deadline = time.monotonic() + 30  # a bound on the wait only: the worker's own record decides
    while not (log := worker.log()) or not log[-1]["cancelled"]:
        assert time.monotonic() < deadline, log
        time.sleep(0.05)
    assert not log[-1]["completed"]  # it learned while still in its prefill, not after it


def test_slow_worker_makes_new_sessions_spill(workers, make_router):
    r = make_router([w.url for w in workers], load_epsilon=0.25, load_floor=1)
    slow = workers[0]
    slow.configure(delay_s=3.0)
    keys = [k for k in (f"spill-{i}" for i in range(200)) if home_of(r, k) == slow.url][:6]
    assert len(keys) == 6

    async def run() -> list[tuple[str, float]]:
        async with httpx.AsyncClient(timeout=10) as client:

            async def one(key: str) -> tuple[str, float]:
                t0 = time.monotonic()
                resp = await client.post(r.url + "/v1/chat/completions", json=chat(key))
                assert resp.status_code == 200
                return resp.headers["x-agentserve-worker"], time.monotonic() - t0

            return await asyncio.gather(*(one(k) for k in keys))

    results = asyncio.run(run())
    on_slow = [t for wid, t in results if wid == slow.url]
    spilled = [t for wid, t in results if wid != slow.url]
    # how many fit on the slow worker depends on how fast the spilled ones finish (they lower
    # the mean); at least one stays home and at least two spill
    assert len(on_slow) >= 1 and len(spilled) >= 2, results
    # the spilled ones were served elsewhere (the header), so they did not queue behind the slow
    # worker; and the ones kept home did wait for it (a lower bound: load only adds to it)
    assert min(on_slow) >= 2.9
    assert metric(r, "agentserve_router_affinity_total", outcome="spilled") == len(spilled)
    # once the slow worker is idle again, its sessions go home
    assert post(r, chat(keys[-1])).headers["x-agentserve-worker"] == slow.url


def test_worker_stream_error_midway_ends_with_sse_error(make_router):
    workers = spawn_fake_workers(3, prefix="k")
    try:
        r = make_router([w.url for w in workers])
        victim = workers[1]
        keys = [k for k in (f"kill-{i}" for i in range(200)) if home_of(r, k) == victim.url][:3]
        victim.configure(chunks=10, chunk_delay_s=0.05, die_after_chunks=2)
        # the client's read timeout (10 s) is far below the router's (300 s): a router that waited
        # on the dead worker instead of ending the stream fails here
        with httpx.stream(
            "POST", r.url + "/v1/chat/completions", json=chat(keys[0], stream=True), timeout=10
        ) as resp:
            assert resp.status_code == 200 and resp.headers["x-agentserve-worker"] == victim.url
            events = sse_events(list(resp.iter_lines()))
        assert len(events) == 4 and events[-1] == "[DONE]", events
        err = json.loads(events[-2])["error"]
        assert err["type"] == "server_error" and err["code"] == "upstream_unavailable"
        assert "mid-stream" in err["message"]
        victim.proc.wait(timeout=5)
        # later turns of its sessions succeed on the next worker in their order
        for key in keys:
            for stream in (False, True):
                resp = post(r, chat(key, stream=stream))
                assert resp.status_code == 200
                assert resp.headers["x-agentserve-worker"] != victim.url
                if stream:
                    assert sse_events(resp.text.splitlines())[-1] == "[DONE]"
        assert metric(r, "agentserve_router_upstream_errors_total", kind="midstream") == 1
        assert metric(r, "agentserve_router_worker_healthy", worker=victim.url) == 0
    finally:
        stop_fake_workers(workers)


def test_killed_worker_in_flight_requests_fail_over_or_error_never_hang(make_router):
    workers = spawn_fake_workers(3, prefix="d")
    try:
        # slow health checks: the router finds out from the requests; no load spill here
        r = make_router([w.url for w in workers], health_interval_s=5.0, load_floor=10)
        victim = workers[2]
        keys = [k for k in (f"dead-{i}" for i in range(300)) if home_of(r, k) == victim.url][:4]
        victim.configure(delay_s=60.0)  # killed long before it would answer

        async def run():
            async with httpx.AsyncClient(timeout=15) as client:

                async def one(key: str, stream: bool):
                    return await client.post(r.url + "/v1/chat/completions", json=chat(key, stream=stream))

                async def kill_soon():
                    await asyncio.sleep(0.5)
                    victim.kill()

                return await asyncio.gather(one(keys[0], False), one(keys[1], True), kill_soon())

        json_resp, sse_resp, _ = asyncio.run(run())
        # nothing had reached the clients yet: both were retried on the next worker and succeeded
        # (the victim never answers: it was killed inside its minute of delay)
        for resp in (json_resp, sse_resp):
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-agentserve-worker"] != victim.url
        assert sse_events(sse_resp.text.splitlines())[-1] == "[DONE]"
        assert metric(r, "agentserve_router_failovers_total", worker=victim.url) == 2
        # later turns: connection refused -> taken out at once -> next worker
        for key in keys:
            resp = post(r, chat(key))
            assert resp.status_code == 200 and resp.headers["x-agentserve-worker"] != victim.url
        assert metric(r, "agentserve_router_upstream_errors_total", worker=victim.url, kind="connect") >= 1
        assert metric(r, "agentserve_router_worker_healthy", worker=victim.url) == 0
    finally:
        stop_fake_workers(workers)


def test_unhealthy_worker_sessions_move_and_come_back(workers, make_router):
    r = make_router([w.url for w in workers])
    keys = [f"move-{i}" for i in range(30)]
    before = {k: post(r, chat(k)).headers["x-agentserve-worker"] for k in keys}
    sick = workers[0]
    sick.configure(healthy=False)
    deadline = time.monotonic() + 30  # bounds the wait only
    while httpx.get(r.url + "/workers", timeout=5).json()["workers"][0]["healthy"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    during = {k: post(r, chat(k)).headers["x-agentserve-worker"] for k in keys}
    assert all(during[k] != sick.url for k in keys)
    assert all(during[k] == before[k] for k in keys if before[k] != sick.url)  # only its sessions moved
    assert any(before[k] == sick.url for k in keys)
    assert metric(r, "agentserve_router_affinity_total", outcome="moved") == sum(
        before[k] == sick.url for k in keys
    )
    sick.configure(healthy=True)
    deadline = time.monotonic() + 30
    while not httpx.get(r.url + "/workers", timeout=5).json()["workers"][0]["healthy"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    after = {k: post(r, chat(k)).headers["x-agentserve-worker"] for k in keys}
    assert after == before


def test_no_healthy_worker_is_a_clear_503(make_router):
    from tests.routing.conftest import listening_socket

    sock = listening_socket()
    dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()  # nothing listens there any more
    r = make_router([dead])
    health = httpx.get(r.url + "/health", timeout=5)
    assert health.status_code == 503 and "no healthy worker" in health.json()["error"]["message"]
    resp = post(r, chat("nobody", stream=True))
    err = resp.json()["error"]
    # answered from the pool's state, without trying the dead address (no connect attempt counted)
    assert metric(r, "agentserve_router_upstream_errors_total", worker="none", kind="no_worker") == 1
    assert metric(r, "agentserve_router_upstream_errors_total", kind="connect") == 0
    assert resp.status_code == 503 and err["code"] == "upstream_unavailable"
    assert "no healthy worker" in err["message"] and dead in err["message"]


def test_hung_worker_times_out_with_a_clear_503(workers, make_router):
    r = make_router([workers[0].url], read_timeout_s=0.5)
    workers[0].configure(delay_s=60.0)  # the router's 0.5 s read timeout, not the worker, ends it
    resp = post(r, chat("hung"))
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "upstream_timeout"
    assert metric(r, "agentserve_router_upstream_errors_total", kind="timeout") == 1


def test_workers_and_metrics_endpoints(workers, make_router):
    r = make_router([f"{w.id}={w.url}" for w in workers])
    for s in range(5):
        post(r, chat(f"m-{s}"))
    info = httpx.get(r.url + "/workers", timeout=5).json()
    assert info["policy"] == "affinity"
    assert [(w["id"], w["url"], w["healthy"], w["in_flight"]) for w in info["workers"]] == [
        (w.id, w.url, True, 0) for w in workers
    ]
    health = httpx.get(r.url + "/health", timeout=5).json()
    assert health == {"status": "ok", "version": __version__, "workers": 3, "healthy": 3}
    text = httpx.get(r.url + "/metrics", timeout=5).text
    for name in (
        "agentserve_router_requests_total",
        "agentserve_router_affinity_total",
        "agentserve_router_added_latency_seconds_bucket",
        "agentserve_router_worker_in_flight",
    ):
        assert name in text
    assert (
        sum(
            float(v)
            for v in re.findall(r'agentserve_router_requests_total\{.*?status="200".*?\} (\S+)', text)
        )
        == 5
    )
    assert metric(r, "agentserve_router_added_latency_seconds_count") == 5
    for ref in ("1", "w1"):
        wm = httpx.get(r.url + f"/metrics/worker/{ref}", timeout=5)
        assert wm.status_code == 200 and 'fake_worker_requests_total{worker="w1"}' in wm.text
    assert httpx.get(r.url + "/metrics/worker/9", timeout=5).status_code == 404


def test_official_openai_client_works_through_the_router(workers, make_router):
    from openai import OpenAI

    r = make_router([w.url for w in workers])
    client = OpenAI(base_url=r.url + "/v1", api_key="none", max_retries=0, timeout=10)
    out = client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hi"}], extra_body={"prompt_cache_key": "oa-1"}
    )
    assert out.choices[0].message.content and out.usage.prompt_tokens_details.cached_tokens == 0
    stream = client.chat.completions.create(
        model="fake",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        extra_body={"prompt_cache_key": "oa-1"},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "tok0 tok1 tok2 "
