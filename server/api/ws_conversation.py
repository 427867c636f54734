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
from server.held_budget import HeldBudget


@dataclass
class Held:
    """The socket's latest response: its id, its conversation (None: too large to hold), its size, and
    whether the process's budget (not the socket's limit) refused it."""

    id: str
    items: list[Any] | None
    nbytes: int
    over_budget: bool = False


def held_budget(state: Any) -> HeldBudget:
    """The app's budget for every socket's held conversation (``held_budget.py``), made on first use."""
    budget: HeldBudget | None = getattr(state, "held_budget", None)
    if budget is None:
        settings = state.settings
        limit = settings.websocket.held_conversations_mb * 2**20
        budget = state.held_budget = HeldBudget(limit, settings.tenant_share())
    return budget


def json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


class Conversation:
    """One socket's latest response and the bytes its conversation holds."""

    def __init__(self, state: Any, tenant: str) -> None:
        self.state, self.tenant = state, tenant
        self.limit: int = state.settings.websocket.max_conversation_bytes
        self.latest: Held | None = None
        self.closed = False

    def history(self, body: dict[str, Any]) -> tuple[list[Any] | None, int]:
        """The conversation ``previous_response_id`` continues (None: none) and its size in bytes."""
        prev = body.get("previous_response_id")
        latest = self.latest
        if prev is not None and latest is not None and prev == latest.id:
            if latest.items is None:
                raise self.over_budget(latest.nbytes) if latest.over_budget else self.too_large(latest.nbytes)
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

    def over_budget(self, nbytes: int) -> InvalidRequest:
        mb = self.state.settings.websocket.held_conversations_mb
        return InvalidRequest(
            f"this socket's conversation ({nbytes} bytes of JSON) was not held: the conversations held by "
            f"this server's sockets are at websocket.held_conversations_mb ({mb} MiB, or this tenant's "
            "limits.tenant_share of it): send the whole conversation in input, or retry later",
            param="previous_response_id",
            code="conversation_too_large",
        )

    def close(self) -> None:
        """The socket ended: what it held is given back to the budget."""
        self.closed = True
        held_budget(self.state).release(self)
        self.latest = None

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
        budget = held_budget(self.state)
        charged = fits and budget.hold(self, self.tenant, nbytes)
        if not charged or self.closed:  # a socket that ended meanwhile holds nothing
            budget.release(self)
        items = list(job.conv.input_items) + output if charged else None
        self.latest = Held(response["id"], items, nbytes, over_budget=fits and not charged)
        if job.body.get("store", True) is not False:
            response_store(self.state).put(self.tenant, job.conv.input_items, response)
