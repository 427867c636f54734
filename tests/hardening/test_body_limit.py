"""Request bodies are limited however they are framed: a chunked body (no Content-Length) is
counted as it arrives and refused with a 413 the moment it passes limits.max_request_bytes, on the
worker and on the router (on main the worker read it whole and tokenized it before a 400)."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import pytest

from server.config import AuthSettings, LimitsSettings, Settings
from tests.hardening.helpers import assert_still_answers, clean_latency

LIMIT = 65536


def send_chunked(url: str, path: str, total: int, headers: str = "") -> tuple[int, dict, float]:
    """POST ``total`` bytes chunked (never finishing past the limit); the status and JSON body."""
    u = urlparse(url)
    sock = socket.create_connection((u.hostname, u.port), timeout=20)
    t0 = time.monotonic()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\n"
        f"Transfer-Encoding: chunked\r\n{headers}\r\n"
    )
    prefix = b'{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "'
    try:
        sock.sendall(head.encode())
        sent, first = 0, True
        while sent < total:
            piece = (prefix if first else b"") + b"a" * 8192
            first = False
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            sent += len(piece)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed: read what it said
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
        more = sock.recv(65536)
        if not more:
            break
        data += more
    sock.close()
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1] or b"{}"), time.monotonic() - t0


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def _check_413(status: int, body: dict) -> None:
    assert status == 413, body
    assert "limits.max_request_bytes" in body["error"]["message"] and str(LIMIT) in body["error"]["message"]


@pytest.mark.e2e
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize"])
def test_a_chunked_body_over_the_limit_is_a_413_on_the_worker(hf_engine, path):
    from server.app import build_app
    from tests.conftest import running_server, worker_settings

    settings = worker_settings().model_copy(update={"limits": LimitsSettings(max_request_bytes=LIMIT)})
    with running_server(build_app(settings, engine=hf_engine)) as url:
        baseline = clean_latency(url)
        status, body, took = send_chunked(url, path, 4 * LIMIT)
        _check_413(status, body)
        assert took < 5
        assert_still_answers(url, baseline)


@pytest.mark.e2e
def test_an_unauthenticated_chunked_body_is_refused_before_it_is_read(hf_engine):
    from server.app import build_app
    from tests.conftest import running_server, worker_settings

    update = {"limits": LimitsSettings(max_request_bytes=LIMIT), "auth": AuthSettings(api_keys={"a": "k"})}
    with running_server(build_app(worker_settings().model_copy(update=update), engine=hf_engine)) as url:
        status, body, _ = send_chunked(url, "/v1/chat/completions", 4 * LIMIT)
        assert status == 401


def test_a_chunked_body_over_the_limit_is_a_413_on_the_router():
    from tests.routing.conftest import RouterThread, spawn_fake_workers, stop_fake_workers

    workers = spawn_fake_workers(1)
    router = RouterThread(Settings(limits=LimitsSettings(max_request_bytes=LIMIT)), [workers[0].url]).start()
    try:
        status, body, _ = send_chunked(router.url, "/v1/chat/completions", 4 * LIMIT)
        _check_413(status, body)
        assert workers[0].log() == []  # the worker never saw it
    finally:
        router.stop()
        stop_fake_workers(workers)


def slow_sender(url: str, path: str) -> tuple[int, dict, float]:
    """Send the headers and one small chunk, then nothing (a slowloris body): the answer."""
    u = urlparse(url)
    sock = socket.create_connection((u.hostname, u.port), timeout=20)
    t0 = time.monotonic()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += "Transfer-Encoding: chunked\r\n\r\n"
    sock.sendall(head.encode() + b"1\r\n{\r\n")
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
        more = sock.recv(65536)
        if not more:
            break
        data += more
    sock.close()
    return int(data.split(b" ", 2)[1]), json.loads(data.split(b"\r\n\r\n", 1)[1]), time.monotonic() - t0


@pytest.mark.e2e
def test_a_body_that_never_finishes_is_a_408_on_the_worker(hf_engine):
    from server.app import build_app
    from tests.conftest import running_server, worker_settings

    limits = LimitsSettings(body_timeout_s=1.0)
    with running_server(
        build_app(worker_settings().model_copy(update={"limits": limits}), engine=hf_engine)
    ) as url:
        status, body, took = slow_sender(url, "/v1/chat/completions")
        assert status == 408 and "limits.body_timeout_s" in body["error"]["message"]
        assert 0.9 < took < 10


def test_a_body_that_never_finishes_is_a_408_on_the_router():
    from tests.routing.conftest import RouterThread, spawn_fake_workers, stop_fake_workers

    workers = spawn_fake_workers(1)
    router = RouterThread(Settings(limits=LimitsSettings(body_timeout_s=1.0)), [workers[0].url]).start()
    try:
        status, body, took = slow_sender(router.url, "/v1/chat/completions")
        assert status == 408 and "limits.body_timeout_s" in body["error"]["message"]
        assert 0.9 < took < 10 and workers[0].log() == []
    finally:
        router.stop()
        stop_fake_workers(workers)
