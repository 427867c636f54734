"""``response.interrupt`` on the Responses WebSocket: the turn a socket is streaming, and the chat
chunks of that turn cut short when the client interrupts it.

Codex (0.169, 0.171) sends ``{"type": "response.interrupt", "response_id": ..., "mode":
"discard_partial_items"}`` when the user presses Esc mid-stream, waits for
``{"type": "response.interrupt.accepted", "response_id": ...}`` (its strings: "invalid interruption
acknowledgement", "response interruption was rejected"), then for the response's terminal event.
The turn's ``stop`` event goes to the chat stream (``ChatService.stream``, server/chat/interruptible.py):
set, it cancels the engine request at once -- also while the engine is busy (prefill, a decode step) --
and the reply ends with ``finish_reason: "interrupted"`` and its real usage, which the Responses
stream turns into ``response.incomplete`` (``incomplete_details.reason: "interrupted"``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from server.dialects.responses.stream import ResponsesStream

ACCEPTED = "response.interrupt.accepted"
DISCARD = "discard_partial_items"  # the mode Codex sends: the item being written is dropped


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
