"""Chat stream chunks → Responses stream events (each with its ``sequence_number``).

Order: ``response.created``, ``response.in_progress``; per output item ``output_item.added``,
then for a reasoning item (a reasoning family) ``content_part.added``, ``reasoning_text.delta``…,
``reasoning_text.done``, ``content_part.done``; for a message ``content_part.added``,
``output_text.delta``…, ``output_text.done``, ``content_part.done``; for a function call
``function_call_arguments.delta``…, ``.done``; for a custom tool call
``custom_tool_call_input.delta``…, ``.done``; then ``output_item.done``. Last:
``response.completed``, or ``response.incomplete`` when the reply was cut by max_output_tokens
(a call cut inside its envelope never reaches the text: it is the ``agentserve.incomplete_tool_call``
extension) or interrupted (the WebSocket's ``response.interrupt``: finish reason ``interrupted``, the
open item ends ``incomplete`` or is dropped), or ``response.failed`` (``failed_event``) when
generation fails mid-stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from server.dialects.responses.response import (
    ResponseContext,
    call_item,
    item_id,
    message_item,
    reasoning_item,
    response_object,
    status_of,
)


class ResponsesStream:
    def __init__(self, ctx: ResponseContext) -> None:
        self.ctx = ctx
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # finished items
        self.open: dict[str, Any] | None = None  # the item being written
        self.open_chat_index: int | None = None
        self.text = ""
        self.finish: str | None = None
        self.final_chunk: dict[str, Any] = {}
        self.final: dict[str, Any] | None = None  # the finished response object
        self.discard_partial = False  # an interrupt's mode discard_partial_items: drop the open item

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def start(self) -> list[dict[str, Any]]:
        head = response_object(self.ctx, "in_progress", [])
        return [
            self._event("response.created", response=head),
            self._event("response.in_progress", response=head),
        ]

    # -- items --------------------------------------------------------------------------------
    def _index(self) -> int:
        return len(self.output)

    def _open_message(self) -> list[dict[str, Any]]:
        n = self._index()
        item = message_item(self.ctx.id, "", status="in_progress")
        if n:
            item["id"] = item_id("msg", self.ctx.id, n)
        self.open, self.open_chat_index, self.text = item, None, ""
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self._event("response.output_item.added", output_index=n, item=dict(item)),
            self._event(
                "response.content_part.added", item_id=item["id"], output_index=n, content_index=0, part=part
            ),
        ]

    def _open_reasoning(self) -> list[dict[str, Any]]:
        n = self._index()
        item = reasoning_item(self.ctx.id, "", status="in_progress")
        self.open, self.open_chat_index, self.text = item, None, ""
        part = {"type": "reasoning_text", "text": ""}
        return [
            self._event("response.output_item.added", output_index=n, item=dict(item)),
            self._event(
                "response.content_part.added", item_id=item["id"], output_index=n, content_index=0, part=part
            ),
        ]

    def _open_call(self, index: int, call: dict[str, Any]) -> list[dict[str, Any]]:
        empty = dict(call)
        if call.get("type") == "custom":
            empty["custom"] = {**(call.get("custom") or {}), "input": ""}
        else:
            empty["function"] = {**(call.get("function") or {}), "arguments": ""}
        item = call_item(self.ctx.id, index, empty, self.ctx.names, status="in_progress")
        self.open, self.open_chat_index = item, index
        return [self._event("response.output_item.added", output_index=self._index(), item=dict(item))]

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item, n = self.open, self._index()
        if item is None:
            return []
        self.open, self.open_chat_index = None, None
        item["status"] = status
        events = []
        if item["type"] == "message":
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            item["content"] = [part]
            ids = {"item_id": item["id"], "output_index": n, "content_index": 0}
            events.append(self._event("response.output_text.done", **ids, text=self.text, logprobs=[]))
            events.append(self._event("response.content_part.done", **ids, part=part))
        elif item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": self.text}
            item["content"] = [part]
            ids = {"item_id": item["id"], "output_index": n, "content_index": 0}
            events.append(self._event("response.reasoning_text.done", **ids, text=self.text))
            events.append(self._event("response.content_part.done", **ids, part=part))
        elif item["type"] == "function_call":
            done = {
                "item_id": item["id"],
                "output_index": n,
                "arguments": item["arguments"],
                "name": item["name"],
            }
            events.append(self._event("response.function_call_arguments.done", **done))
        else:
            done = {"item_id": item["id"], "output_index": n, "input": item["input"]}
            events.append(self._event("response.custom_tool_call_input.done", **done))
        self.output.append(item)
        events.append(self._event("response.output_item.done", output_index=n, item=item))
        return events

    # -- chunks -------------------------------------------------------------------------------
    def _content(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self.open is None or self.open["type"] != "message":
            events += self._close() + self._open_message()
        assert self.open is not None
        self.text += text
        ids = {"item_id": self.open["id"], "output_index": self._index(), "content_index": 0}
        return events + [self._event("response.output_text.delta", **ids, delta=text, logprobs=[])]

    def _reasoning(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self.open is None or self.open["type"] != "reasoning":
            events += self._close() + self._open_reasoning()
        assert self.open is not None
        self.text += text
        ids = {"item_id": self.open["id"], "output_index": self._index(), "content_index": 0}
        return events + [self._event("response.reasoning_text.delta", **ids, delta=text)]

    def _call(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        index = delta.get("index", 0)
        events = []
        if self.open is None or self.open_chat_index != index:
            events += self._close() + self._open_call(index, delta)
        item = self.open
        assert item is not None
        ids = {"item_id": item["id"], "output_index": self._index()}
        if item["type"] == "custom_tool_call":
            piece = (delta.get("custom") or {}).get("input") or ""
            if piece:
                item["input"] += piece
                events.append(self._event("response.custom_tool_call_input.delta", **ids, delta=piece))
        else:
            piece = (delta.get("function") or {}).get("arguments") or ""
            if piece:
                item["arguments"] += piece
                events.append(self._event("response.function_call_arguments.delta", **ids, delta=piece))
        return events

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """Events for one chat chunk (the final chunk and the usage chunk only record)."""
        events: list[dict[str, Any]] = []
        for ext in ("cache", "tool_state"):
            if chunk.get(ext) is not None:
                self.final_chunk[ext] = chunk[ext]
        if chunk.get("usage"):
            self.final_chunk["usage"] = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                events += self._reasoning(delta["reasoning_content"])
            if delta.get("content"):
                events += self._content(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            if choice.get("finish_reason") is not None:
                self.finish = choice["finish_reason"]
                self.final_chunk["incomplete_tool_call"] = choice.get("incomplete_tool_call")
        return events

    def finish_events(self) -> list[dict[str, Any]]:
        if self.finish != "interrupted":
            events = self._close()
        elif self.discard_partial:  # interrupted (WebSocket): the item being written is dropped
            events, self.open, self.open_chat_index = [], None, None
        else:  # interrupted: the item being written ends incomplete
            events = self._close("incomplete")
        status = status_of(self.finish)
        cut = self.final_chunk.get("incomplete_tool_call")
        self.final = response_object(
            self.ctx, status, self.output, self.final_chunk, finish=self.finish, cut=cut
        )
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return events + [self._event(kind, response=self.final)]

    def failed_event(self, body: dict[str, Any]) -> dict[str, Any]:
        """``response.failed`` for an error after the stream began (``Framing.error_event``)."""
        err = body.get("error") or {}
        # OpenAI's codes are a closed list: ours (generation_failed, timeout, ...) leads the message
        code = "rate_limit_exceeded" if err.get("type") == "rate_limit_error" else "server_error"
        ours = err.get("code") or err.get("type") or "error"
        error = {"code": code, "message": f"{ours}: {err.get('message', '')}"}
        obj = response_object(self.ctx, "failed", self.output, self.final_chunk, error=error)
        return self._event("response.failed", response=obj)

    async def events(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        for ev in self.start():
            yield ev
        try:
            async for chunk in chunks:
                for ev in self.feed(chunk):
                    yield ev
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        for ev in self.finish_events():
            yield ev
