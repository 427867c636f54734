"""Chat stream chunks -> Anthropic stream events.

``message_start`` (usage: the prompt's tokens; the cache split comes with ``message_delta``),
``ping``, then per block ``content_block_start`` / ``content_block_delta`` (``thinking_delta``
then one ``signature_delta`` for a reasoning family's thinking block, ``text_delta``,
``input_json_delta`` with a call's whole arguments once the call is complete) /
``content_block_stop``, then ``message_delta`` (``stop_reason``, ``stop_sequence``, the final
usage, and our extensions: ``cache``, ``tool_state``, ``incomplete_tool_call``, ``diagnostics``),
then ``message_stop``. An error after the stream began is an ``error`` event (``errors.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from server.dialects.messages import ids
from server.dialects.messages.response import Prepared, Reply, extensions, signature, stop_reason, usage


class _Blocks:
    """Open/close content blocks, numbered in order."""

    def __init__(self) -> None:
        self.count = 0
        self.open: str | None = None  # the type of the open block
        self.thought = ""  # the open thinking block's text (for its signature)

    def _stop(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.count - 1}]

    def start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.close()
        self.open = block["type"]
        self.count += 1
        return [*events, {"type": "content_block_start", "index": self.count - 1, "content_block": block}]

    def thinking(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self.open != "thinking":
            events = self.start({"type": "thinking", "thinking": "", "signature": ""})
            self.thought = ""
        self.thought += text
        delta = {"type": "thinking_delta", "thinking": text}
        return [*events, {"type": "content_block_delta", "index": self.count - 1, "delta": delta}]

    def close(self) -> list[dict[str, Any]]:
        if self.open == "thinking":  # the signature comes last, as Anthropic sends it
            delta = {"type": "signature_delta", "signature": signature(self.thought)}
            sig = [{"type": "content_block_delta", "index": self.count - 1, "delta": delta}]
            return sig + self._stop()
        return self._stop()

    def text(self, text: str) -> list[dict[str, Any]]:
        events = [] if self.open == "text" else self.start({"type": "text", "text": ""})
        delta = {"type": "text_delta", "text": text}
        return [*events, {"type": "content_block_delta", "index": self.count - 1, "delta": delta}]

    def call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        fn = call.get("function") or {}
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": ids.tool_use_id(call["id"]),
            "name": fn.get("name"),
            "input": {},
        }
        events = self.start(block)
        arguments = fn.get("arguments") or ""
        if arguments:
            delta = {"type": "input_json_delta", "partial_json": arguments}
            events.append({"type": "content_block_delta", "index": self.count - 1, "delta": delta})
        return [*events, *self.close()]


def message_start(p: Prepared, reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {
        "id": ids.message_id(p.request_id),
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": len(p.prompt_ids),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 0,
        },
    }
    if reply.diagnostics:
        message["diagnostics"] = {"cache_miss_reason": None}  # Anthropic: "pending"; see message_delta
    return {"type": "message_start", "message": message}


async def message_events(
    p: Prepared, reply: Reply, chunks: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[dict[str, Any]]:
    """The Anthropic events for a chat stream (``serve_prepared``'s ``to_stream``).

    Closing this generator (the client went away) closes ``chunks``, which cancels the engine request.
    """
    try:
        async for event in _events(p, reply, chunks):
            yield event
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


async def _events(
    p: Prepared, reply: Reply, chunks: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[dict[str, Any]]:
    yield message_start(p, reply)
    yield {"type": "ping"}
    blocks = _Blocks()
    finish: str | None = None
    matched: str | None = None
    incomplete: Any = None
    last: dict[str, Any] = {}
    chat_usage: dict[str, Any] | None = None
    async for chunk in chunks:
        for choice in [] if reply.warm_up else chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                for event in blocks.thinking(delta["reasoning_content"]):
                    yield event
            if delta.get("content"):
                for event in blocks.text(delta["content"]):
                    yield event
            for call in delta.get("tool_calls") or []:
                for event in blocks.call(call):
                    yield event
            if choice.get("finish_reason"):
                finish, matched = choice["finish_reason"], choice.get("stop_reason")
                incomplete = choice.get("incomplete_tool_call")
        if chunk.get("cache") is not None:
            last = chunk
        if chunk.get("usage"):
            chat_usage = chunk["usage"]
    for event in blocks.close():
        yield event
    reason, sequence = stop_reason(p, reply, finish, matched)
    yield {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": sequence},
        "usage": usage(chat_usage, reply.warm_up),
        **extensions(reply, last, incomplete),
    }
    yield {"type": "message_stop"}
