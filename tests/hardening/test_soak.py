"""Soak: 32 concurrent agent sessions x 10 turns on the embedded model; 0 errors, RSS stable."""

from __future__ import annotations

import asyncio
import os
import statistics

import httpx
import psutil
import pytest

from server.app import build_app
from tests.conftest import running_server, worker_settings

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SESSIONS = int(os.environ.get("AGENTSERVE_SOAK_SESSIONS", "32"))
TURNS = int(os.environ.get("AGENTSERVE_SOAK_TURNS", "10"))


async def session(client: httpx.AsyncClient, url: str, i: int, results: list, rss: list, engine) -> None:
    msgs = [
        {"role": "system", "content": f"Agent {i}. Use tools carefully. " * 8},
        {"role": "user", "content": f"Task {i}: inspect the repo."},
    ]
    for turn in range(TURNS):
        body = {
            "model": "smollm2-135m-instruct",
            "messages": msgs,
            "max_tokens": 2,
            "temperature": 0,
            "prompt_cache_key": f"soak-{i}",
        }
        r = await client.post(url + "/v1/chat/completions", json=body)
        results.append((turn, r.status_code, r.json() if r.status_code == 200 else r.text))
        # the prefix cache grows by design (bounded by its budget): what must stay flat is the rest
        rss.append(psutil.Process().memory_info().rss - engine.cache.used_bytes)
        reply = r.json()["choices"][0]["message"]["content"] or "" if r.status_code == 200 else ""
        msgs = msgs + [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": f"observation {turn}: " + "ls -la output line\n" * 3},
        ]


@pytest.mark.timeout(900)
def test_soak(hf_engine):
    with running_server(build_app(worker_settings(), engine=hf_engine)) as url:
        results: list = []
        rss: list[int] = []

        async def main():
            limits = httpx.Limits(max_connections=SESSIONS)
            async with httpx.AsyncClient(timeout=300, limits=limits) as client:
                sessions = (session(client, url, i, results, rss, hf_engine) for i in range(SESSIONS))
                await asyncio.gather(*sessions)

        asyncio.run(main())
    assert hf_engine.cache.used_bytes <= hf_engine.cache.capacity_bytes
    errors = [(t, s, b) for t, s, b in results if s != 200]
    assert len(results) == SESSIONS * TURNS and errors == []
    later = [b for t, _, b in results if t > 0]
    hit = sum(b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in later)
    total = sum(b["usage"]["prompt_tokens"] for b in later)
    assert hit / total > 0.5, f"cache hit rate {hit / total:.2f} over turns 2-10"
    third = len(rss) // 3
    first, last = statistics.mean(rss[:third]), statistics.mean(rss[-third:])
    print(
        f"soak: {len(results)} requests, 0 errors, hit rate {hit / total:.2f}, "
        f"RSS less prefix cache {first / 2**20:.0f} -> {last / 2**20:.0f} MiB"
    )
    assert last < first * 1.15, (first, last)
