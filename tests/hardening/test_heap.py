"""Freed heap goes back to the OS (server/heap.py): after start-up (the tokenizer's parse left
~150 MB of freed heap resident on the 1B Llama GGUF) and when the llamacpp engine goes idle."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from server import heap
from server.app import build_app
from server.config import load_settings


def rss_anon_mb() -> float:
    for line in open("/proc/self/status").read().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(not heap.can_release(), reason="this C library has no malloc_trim")
def test_freed_heap_below_the_top_goes_back_to_the_os():
    blocks = [bytes(4000) for _ in range(30_000)]  # ~120 MB of malloc'd chunks (each over 512 bytes)
    keep = bytes(4000)  # allocated last: the freed chunks are not at the heap's top, so free() keeps them
    del blocks
    before = rss_anon_mb()
    assert heap.release_free_heap()
    assert before - rss_anon_mb() > 60
    assert len(keep) == 4000


@pytest.mark.e2e
def test_the_worker_releases_the_heap_once_its_chat_service_is_built(hf_engine, monkeypatch):
    seen: list[bool] = []
    app = build_app(load_settings(device="cpu"), engine=hf_engine)
    monkeypatch.setattr("server.app.release_free_heap", lambda: seen.append(hasattr(app.state, "service")))
    with TestClient(app) as c:
        assert c.get("/health").status_code == 200
    assert seen == [True]  # after the service's vocabulary tables, not before them
