"""A streaming client that stops reading gives its admission slot back (issue 37 item 5), and a
stream silent through prefill or hidden reasoning sends keep-alives (issue 36 item 6)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from server.api.sse import KEEPALIVE_COMMENT, Framing, sse_stream
from server.engines.base import GenerationChunk, GenerationRequest
from tests.engines.fake import ScriptedEngine


class Endless(ScriptedEngine):
    """Streams tokens until cancelled (a long answer), recording when its request ends."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, reply="lorem ipsum dolor sit amet " * 8)
        self.max_model_len = 1 << 20
        self.running = 0
        self.ended = 0

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.running += 1
        try:
            while True:
                yield GenerationChunk(list(self.reply_ids), 0)
                await asyncio.sleep(0)
        finally:
            self.running -= 1
            self.ended += 1


def _stall(port: int, body: dict[str, Any]) -> socket.socket:
    """Send a streaming request and never read the answer (a tiny receive buffer fills at once)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def test_a_client_that_never_reads_frees_its_slot_after_the_send_timeout(tokenizer):
    from server.app import build_app
    from server.config import load_settings
    from tests.conftest import running_server

    engine = Endless(tokenizer)
    settings = load_settings(
        device="cpu", limits={"stream_send_timeout_s": 1.0, "max_concurrent_requests": 2}
    )
    app = build_app(settings, engine=engine)
    with running_server(app) as url:
        port = int(url.rsplit(":", 1)[1])
        body = {"model": settings.served_model_name, "stream": True, "max_tokens": 10**6}
        body["messages"] = [{"role": "user", "content": "hi"}]
        socks = [_stall(port, body) for _ in range(2)]  # every generating slot taken by a non-reader
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 20 and (engine.ended < 2 or app.state.admission.inside):
                time.sleep(0.1)
            # before: both writes blocked for good, the engine requests suspended, the slots held
            assert engine.ended == 2 and engine.running == 0, "the stalled streams were never ended"
            assert app.state.admission.inside == 0
            assert time.monotonic() - t0 < 15
        finally:
            for s in socks:
                s.close()


async def _frames(
    chunks: AsyncIterator[dict[str, Any]], framing: Framing | None, keepalive: float
) -> list[str]:
    return [f async for f in sse_stream(chunks, None, 30, framing, keepalive)]


async def _slow_first(delay: float) -> AsyncIterator[dict[str, Any]]:
    await asyncio.sleep(delay)  # prefill: nothing to send yet
    yield {"type": "content_block_delta", "n": 1}
    yield {"type": "message_stop"}


def test_a_silent_stream_sends_keepalives_and_never_loses_the_pending_chunk():
    frames = asyncio.run(_frames(_slow_first(0.55), None, 0.1))
    assert frames.count(KEEPALIVE_COMMENT) >= 3  # an SSE comment (chat, Responses): clients skip it
    assert frames[-3:] == [
        'data: {"type":"content_block_delta","n":1}\n\n',
        'data: {"type":"message_stop"}\n\n',
        "data: [DONE]\n\n",
    ]
    from server.api.messages import FRAMING

    frames = asyncio.run(_frames(_slow_first(0.35), FRAMING, 0.1))
    pings = [f for f in frames if f.startswith("event: ping\n")]
    assert len(pings) >= 2 and pings[0] == 'event: ping\ndata: {"type":"ping"}\n\n'  # Anthropic's own
    assert frames[-1].startswith("event: message_stop")
    quiet = asyncio.run(_frames(_slow_first(0.3), FRAMING, 0))
    assert not [f for f in quiet if "ping" in f]  # 0: off


def test_the_stream_deadline_still_ends_a_silent_stream():
    async def never() -> AsyncIterator[dict[str, Any]]:
        await asyncio.sleep(60)
        yield {}

    async def run() -> list[str]:
        return [f async for f in sse_stream(never(), None, 0.35, None, 0.1)]

    t0 = time.monotonic()
    frames = asyncio.run(run())
    assert time.monotonic() - t0 < 2
    assert "limits.request_timeout_s" in frames[-2] and frames.count(KEEPALIVE_COMMENT) >= 2


@pytest.mark.parametrize(
    "metadata",
    [{f"k{i}": "v" for i in range(17)}, {"k": "v" * 513}, {"k" * 65: "v"}, {"k": {"nested": 1}}],
)
def test_responses_metadata_is_bounded_as_openai_bounds_it(metadata):
    from server.dialects.responses.request import to_chat
    from server.errors import InvalidRequest

    body = {"model": "m", "input": "hi"}
    to_chat({**body, "metadata": {f"k{i}": "v" * 512 for i in range(16)}})  # OpenAI's limits pass
    with pytest.raises(InvalidRequest) as err:
        to_chat({**body, "metadata": metadata})
    assert err.value.param == "metadata"
