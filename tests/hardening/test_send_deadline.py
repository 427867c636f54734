"""Issue 55 item 1: every answer goes out through one sender with a deadline, on the worker and
through the router; the router's SSE relay is linear in the bytes and holds a bounded window.

Before: 4 clients that never read a 7 MiB non-streamed answer each still got all of it 45 s later
(the server held it whole in the transport's buffer), and ~130 of them filled a 1 GiB router."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx
from fastapi.responses import JSONResponse

from server.app import build_app
from server.config import load_settings
from server.routing.relay import EventRelay
from server.routing.router_app import create_router_app
from tests.conftest import running_server
from tests.engines.fake import ScriptedEngine

BIG = 16 * 2**20  # well over what the kernel's socket buffers take (tcp_wmem's 4 MiB at most)
EVENT = 8 * 2**20
DEADLINE_S = 1.0


def big_answer_worker(tokenizer: Any) -> Any:
    """A worker whose ``GET /v1/test/big`` answers 8 MiB of JSON (as a large stored response does)."""
    settings = load_settings(device="cpu", limits={"stream_send_timeout_s": DEADLINE_S})
    app = build_app(settings, engine=ScriptedEngine(tokenizer))
    blob = {"blob": "x" * BIG}

    @app.get("/v1/test/big")
    async def big() -> JSONResponse:
        return JSONResponse(blob)

    return app


def stall(url: str, path: str) -> socket.socket:
    """Ask for ``path`` and read nothing."""
    port = int(url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return sock


def drain(sock: socket.socket, timeout_s: float) -> tuple[int, bool]:
    """(bytes read, whether the server closed) reading until the end or ``timeout_s`` of silence."""
    sock.settimeout(timeout_s)
    got = 0
    try:
        while True:
            data = sock.recv(1 << 20)
            if not data:
                return got, True
            got += len(data)
    except TimeoutError:
        return got, False
    finally:
        sock.close()


def assert_dropped(url: str, n: int = 3) -> None:
    socks = [stall(url, "/v1/test/big") for _ in range(n)]
    t0 = time.monotonic()
    time.sleep(DEADLINE_S + 2.0)  # past the deadline: the answers are abandoned
    for sock in socks:
        got, closed = drain(sock, 5.0)
        assert closed, "a client that did not read was never dropped"
        # what is left: one slice in the transport, and the kernel's socket buffers
        assert got < BIG // 2, f"the server still held {got} bytes of the answer for it"
    assert time.monotonic() - t0 < 15
    r = httpx.get(url + "/v1/test/big", timeout=60)  # a client that reads gets all of it
    assert r.status_code == 200 and len(r.json()["blob"]) == BIG


def test_a_worker_drops_a_client_that_does_not_read_its_json(tokenizer):
    with running_server(big_answer_worker(tokenizer)) as url:
        assert_dropped(url)


def test_the_router_drops_a_client_that_does_not_read_its_json(tokenizer):
    with running_server(big_answer_worker(tokenizer)) as worker:
        settings = load_settings(device="cpu", limits={"stream_send_timeout_s": DEADLINE_S})
        with running_server(create_router_app(settings, [worker])) as url:
            assert_dropped(url)


async def _relay(event_bytes: int, chunk: int, window: int) -> tuple[list[bytes], int, float]:
    sent: list[bytes] = []

    async def send(message: Any) -> None:
        sent.append(message["body"])

    relay = EventRelay(send, window=window)
    data = b"data: " + b"x" * event_bytes + b"\n\n" + b"data: [DONE]\n\n"
    most_held = 0
    t0 = time.perf_counter()
    for i in range(0, len(data), chunk):
        await relay.push(data[i : i + chunk])
        most_held = max(most_held, relay.held_bytes)
    await relay.finish()
    took = time.perf_counter() - t0
    assert b"".join(sent) == data
    return sent, most_held, took


def test_the_sse_relay_is_linear_and_holds_a_bounded_window():
    # one 8 MiB event in 4 KiB reads: quadratic was 2,048 copies of up to 8 MiB (26 s on the CI box)
    _, _, took = asyncio.run(_relay(EVENT, 4096, window=EVENT * 2))
    assert took < 1.0, f"relaying one 8 MiB event took {took:.2f} s"
    sent, most_held, _ = asyncio.run(_relay(EVENT, 4096, window=256 * 1024))
    assert most_held <= 256 * 1024 + 4096 and len(sent) > 16  # passed on in pieces past the window
    sent, _, _ = asyncio.run(_relay(10, 3, window=256 * 1024))  # boundaries split across reads
    assert sent[0] == b"data: xxxxxxxxxx\n\n" and sent[1] == b"data: [DONE]\n\n"


def test_a_failure_inside_a_torn_event_ends_it_first():
    sent: list[bytes] = []

    async def send(message: Any) -> None:
        sent.append(message["body"])

    async def run() -> None:
        from server.errors import UpstreamUnavailable

        relay = EventRelay(send, window=8)
        await relay.push(b"data: one\n\ndata: a long event")
        await relay.fail(UpstreamUnavailable("gone"))

    asyncio.run(run())
    assert sent[0] == b"data: one\n\n" and sent[1] == b"data: a long event"
    assert sent[2].startswith(b"\n\ndata: {") and sent[2].endswith(b"data: [DONE]\n\n")


def test_uvicorns_line_for_each_dropped_answer_is_expected_not_an_error():
    import logging

    from server.send_deadline import INCOMPLETE_RESPONSE, DropLogFilter

    drops = DropLogFilter()

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, msg, None, None)

    assert drops.filter(record(INCOMPLETE_RESPONSE + "."))  # nothing dropped here: a real bug, kept
    drops.dropped()
    assert not drops.filter(record(INCOMPLETE_RESPONSE + "."))  # the one we abandoned: expected
    assert drops.filter(record(INCOMPLETE_RESPONSE + ".")) and drops.filter(record("other"))
