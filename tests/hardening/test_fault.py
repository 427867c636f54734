"""Fault: kill a real worker during a concurrent run behind `serve --workers 2`.

No request hangs; every request either succeeds or fails with a clear OpenAI-shaped
error; the sessions of the dead worker continue on the other one.
"""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from tests.routing.conftest import real_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]
SESSIONS, TURNS = 8, 6


def test_killing_a_worker_mid_run_loses_nothing_silently(embedded_model_dir):
    outcomes: list[tuple[int, int, int, float, str]] = []  # session, turn, status, seconds, error code
    killed = threading.Event()
    with real_cluster(2, health_interval_s=0.5) as (url, proc):

        def run_session(s: int) -> None:
            msgs = [{"role": "system", "content": f"Agent {s}. Keep answers to three words."}]
            with httpx.Client(timeout=120) as client:
                for t in range(TURNS):
                    msgs.append({"role": "user", "content": f"step {t}"})
                    t0 = time.monotonic()
                    r = client.post(
                        url + "/v1/chat/completions",
                        json={
                            "model": "smollm2-135m-instruct",
                            "messages": msgs,
                            "max_tokens": 3,
                            "temperature": 0,
                            "prompt_cache_key": f"fault-{s}",
                        },
                    )
                    code = "" if r.status_code == 200 else r.json()["error"]["code"]
                    outcomes.append((s, t, r.status_code, time.monotonic() - t0, code))
                    reply = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else ""
                    msgs.append({"role": "assistant", "content": reply or ""})
                    if t == 1 and s == 0 and not killed.is_set():
                        victim = psutil.Process(proc.pid).children()[0]
                        victim.send_signal(signal.SIGKILL)
                        killed.set()

        with ThreadPoolExecutor(SESSIONS) as pool:
            list(pool.map(run_session, range(SESSIONS)))
        assert killed.is_set()
        assert httpx.get(url + "/health", timeout=5).json()["healthy"] == 1
    assert len(outcomes) == SESSIONS * TURNS  # every request came back (none hung)
    failures = [o for o in outcomes if o[2] != 200]
    assert all(o[2] in (502, 503) and o[4] for o in failures), failures  # clear, OpenAI-shaped
    assert len(failures) <= SESSIONS  # at most the requests in flight at the kill
    last_turns = [o for o in outcomes if o[1] == TURNS - 1]
    assert all(o[2] == 200 for o in last_turns), last_turns  # every session continued
    assert max(o[3] for o in outcomes) < 120
    print(
        f"fault: {len(outcomes)} requests, {len(failures)} failed with clear errors "
        f"{sorted({o[4] for o in failures})}, sessions continued on the surviving worker"
    )
