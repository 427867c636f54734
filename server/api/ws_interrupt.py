"""``response.interrupt`` on the Responses WebSocket: the turn a socket is streaming, and the chat
chunks of that turn cut short when the client interrupts it.

Codex (0.169, 0.171) sends ``{"type": "response.interrupt", "response_id": ..., "mode":
"discard_partial_items"}`` when the user presses Esc mid-stream, waits for
``{"type": "response.interrupt.accepted", "response_id": ...}`` (its strings: "invalid interruption
acknowledgement", "response interruption was rejected"), then for the response's terminal event.
``until_stopped`` ends the chunk stream as soon as the turn is stopped -- also while the engine is
busy (prefill, a decode step): the engine request is closed at once (the hf engine drops it before
its next decode step) and one last chunk with ``finish_reason: "interrupted"`` follows, which the
Responses stream turns into ``response.incomplete`` (``incomplete_details.reason: "interrupted"``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from server.dialects.responses.stream import ResponsesStream

ACCEPTED = "response.interrupt.accepted"
DISCARD = "discard_partial_items"  # the mode Codex sends: the item being written is dropped
INTERRUPTED = "interrupted"  # the chat finish reason of an interrupted turn


@dataclass
class ActiveTurn:
    """The response a socket is streaming: what an interrupt names and stops."""

    id: str
    events: ResponsesStream
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def interrupt(self, message: dict[str, Any]) -> dict[str, Any]:
        """Stop the turn; the acknowledgement to send (before the turn's terminal event)."""
        self.events.discard_partial = message.get("mode") == DISCARD
        self.stop.set()
        return {"type": ACCEPTED, "response_id": self.id}


def interrupted_chunk() -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {}, "finish_reason": INTERRUPTED}]}


async def until_stopped(
    chunks: AsyncIterator[dict[str, Any]], turn: ActiveTurn
) -> AsyncIterator[dict[str, Any]]:
    """``chunks`` until ``turn`` is stopped; then they are closed (the engine request cancelled) and
    one ``interrupted`` chunk ends the stream."""
    stop = asyncio.ensure_future(turn.stop.wait())
    step: asyncio.Future[dict[str, Any]] | None = None
    try:
        while not turn.stop.is_set():
            step = asyncio.ensure_future(anext(chunks))
            await asyncio.wait((step, stop), return_when=asyncio.FIRST_COMPLETED)
            if not step.done():  # stopped while the engine works: cancel it where it waits
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)
                break
            try:
                chunk = step.result()
            except StopAsyncIteration:
                return
            yield chunk
        await chunks.aclose()  # type: ignore[attr-defined]  # the engine request ends before the last event
        yield interrupted_chunk()
    finally:  # also when this stream is cancelled (the client left) or closed early
        stop.cancel()
        if step is not None and not step.done():
            step.cancel()
            await asyncio.gather(step, return_exceptions=True)
        await chunks.aclose()  # type: ignore[attr-defined]
