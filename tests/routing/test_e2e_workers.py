"""Three real worker processes behind `agentserve serve --workers 3` on the embedded model."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.routing.conftest import real_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

SESSIONS, TURNS = 20, 5
SYSTEM = (
    "You are a terse assistant inside an agent loop. Answer in at most five words. "
    "Never explain. Never apologise. Keep every answer short and plain. "
) * 2


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
def test_sessions_stay_on_one_real_worker_and_hit_its_cache(embedded_model_dir):
    with real_cluster(3, health_interval_s=2) as (url, proc):
        assert httpx.get(url + "/health", timeout=5).json()["healthy"] == 3
        history = {s: [{"role": "system", "content": SYSTEM}] for s in range(SESSIONS)}
        seen: dict[int, list[tuple[str, int]]] = {s: [] for s in range(SESSIONS)}

        def turn(client: httpx.Client, s: int, t: int) -> None:
            history[s].append({"role": "user", "content": f"Session {s}, step {t}: say ok."})
            resp = client.post(
                url + "/v1/chat/completions",
                json={
                    "model": "smollm2-135m-instruct",
                    "messages": history[s],
                    "max_tokens": 3,
                    "temperature": 0,
                    "prompt_cache_key": f"e2e-route-{s}",
                },
            )
            assert resp.status_code == 200, resp.text
            body = resp.json()
            seen[s].append(
                (resp.headers["x-agentserve-worker"], body["usage"]["prompt_tokens_details"]["cached_tokens"])
            )
            history[s].append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})

        # 3 requests at a time: never above routing.load_floor in flight on one worker, so no
        # request spills and "every turn on one worker" is exact
        with httpx.Client(timeout=120) as client, ThreadPoolExecutor(3) as pool:
            for t in range(TURNS):
                list(pool.map(lambda s, t=t: turn(client, s, t), range(SESSIONS)))

        for s, turns in seen.items():
            assert len({w for w, _ in turns}) == 1, (s, turns)
            assert all(cached > 0 for _, cached in turns[1:]), (s, turns)
        assert len({turns[0][0] for turns in seen.values()}) >= 2  # sessions spread over workers
        metrics = httpx.get(url + "/metrics", timeout=5).text
        assert 'agentserve_router_affinity_total{outcome="kept"} 100.0' in metrics
        worker_metrics = httpx.get(url + "/metrics/worker/0", timeout=10)
        assert worker_metrics.status_code == 200 and worker_metrics.headers["x-agentserve-worker"] == "w0"
    err = proc.stderr.read()
    assert "workers stopped" in err, err[-2000:]
