"""The conversation a Responses WebSocket holds for its next ``previous_response_id`` turn.

Only the latest response is held (in memory, whatever ``store`` says: with ``store: false`` it stays
in the socket; ``store: true`` also puts it in the tenant's store). Its size in bytes is kept as it
grows (the new input items + the output, encoded once each), so the bound
(``websocket.max_conversation_bytes``) costs no re-encoding of the history; past it a turn is a 400
``conversation_too_large``. ``job`` (the history converted into a chat request) and ``remember``
run in a thread, off the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from server.api.responses import ResponseJob, response_store, stored_history
from server.errors import InvalidRequest


@dataclass
class Held:
    """The socket's latest response: its id, its conversation (None: too large to hold) and its size."""

    id: str
    items: list[Any] | None
    nbytes: int


def json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


class Conversation:
    """One socket's latest response and the bytes its conversation holds."""

    def __init__(self, state: Any, tenant: str) -> None:
        self.state, self.tenant = state, tenant
        self.limit: int = state.settings.websocket.max_conversation_bytes
        self.latest: Held | None = None

    def history(self, body: dict[str, Any]) -> tuple[list[Any] | None, int]:
        """The conversation ``previous_response_id`` continues (None: none) and its size in bytes."""
        prev = body.get("previous_response_id")
        latest = self.latest
        if prev is not None and latest is not None and prev == latest.id:
            if latest.items is None:
                raise self.too_large(latest.nbytes)
            return latest.items, latest.nbytes
        found = response_store(self.state).get(self.tenant, prev) if isinstance(prev, str) else None
        if found is not None:
            return found.items, found.size
        try:
            return stored_history(response_store(self.state), self.tenant, body), 0
        except InvalidRequest as exc:
            exc.code = "previous_response_not_found"
            raise

    def too_large(self, nbytes: int) -> InvalidRequest:
        limit = self.limit
        return InvalidRequest(
            f"this socket's conversation would be {nbytes} bytes, over websocket.max_conversation_bytes "
            f"({limit}): compact it, or start a new one without previous_response_id",
            param="previous_response_id",
            code="conversation_too_large",
        )

    def job(self, headers: Mapping[str, str], body: dict[str, Any]) -> tuple[ResponseJob, int]:
        """The turn's job and its conversation's size (run in a thread: it converts the whole history)."""
        history, held = self.history(body)
        nbytes = held + json_bytes(body.get("input"))
        if nbytes > self.limit:
            raise self.too_large(nbytes)
        return ResponseJob(self.state.service, headers, self.tenant, body, history), nbytes

    def remember(self, job: ResponseJob, response: dict[str, Any], nbytes: int) -> None:
        """Hold the response's conversation for the next turn (in a thread: sizes, the store's copy)."""
        output = list(response.get("output") or [])
        nbytes += json_bytes(output)
        fits = nbytes <= self.limit
        self.latest = Held(response["id"], list(job.conv.input_items) + output if fits else None, nbytes)
        if job.body.get("store", True) is not False:
            response_store(self.state).put(self.tenant, job.conv.input_items, response)
