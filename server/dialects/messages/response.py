"""A chat completion -> an Anthropic Message (+ the pieces the stream shares).

- content: the reply's text as one ``text`` block, then one ``tool_use`` block per call
  (id ``toolu_…``, ``input`` the arguments as an object). A call cut by ``max_tokens`` is never
  text: it is the extension ``incomplete_tool_call`` (name + arguments as written).
- ``stop_reason``: ``end_turn``, ``stop_sequence`` (+ ``stop_sequence``), ``tool_use``, ``max_tokens``,
  or ``model_context_window_exceeded`` when ``max_tokens`` was lowered to fit the window and the
  reply filled it.
- ``usage``: ``input_tokens`` = prompt tokens not read from cache, ``cache_read_input_tokens``,
  ``cache_creation_input_tokens`` = 0 (the prefix cache stores every prompt as a side effect: no
  separate write), ``output_tokens``.
- ``diagnostics`` (when the request sent ``diagnostics``): ``cache_miss_reason`` in Anthropic's
  types, mapped from the cache report; plus our ``cache``, ``tool_state`` and ``dropped_tools``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.dialects.messages import ids

# our cache-miss types -> Anthropic's ``cache_miss_reason`` types; the rest (evicted, expired,
# first_request, none) are not a change of the request: no reason (Anthropic compares structure)
MISS_TYPES = {
    "model_changed": "model_changed",
    "system_changed": "system_changed",
    "tools_changed": "tools_changed",
    "messages_changed": "messages_changed",
    "template_rewrote_history": "messages_changed",
    "reply_changed": "messages_changed",
    "reply_cut": "messages_changed",
    "settings_changed": "unavailable",
    "unavailable": "unavailable",
}


class Prepared(Protocol):
    """What the converters read of ``server.chat.prepared.Prepared`` (a leaf module: no chat import)."""

    request_id: str
    prompt_ids: list[int]
    sampling: Any  # SamplingParams: max_tokens as lowered to fit the window


@dataclass
class Reply:
    """What the converters need besides the chat output."""

    model: str  # the model name the client sent
    max_tokens: int | None  # as asked (the chat request may hold less: lowered to fit the window)
    dropped_tools: list[str] = field(default_factory=list)
    diagnostics: bool = False
    compare_with: str | None = None  # the chat id diagnostics compare against
    warm_up: bool = False  # max_tokens 0: no content, stop_reason max_tokens, output_tokens 0


def stop_reason(p: Prepared, reply: Reply, finish: str | None, matched: str | None) -> tuple[str, str | None]:
    if reply.warm_up:
        return "max_tokens", None
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        lowered = reply.max_tokens is not None and p.sampling.max_tokens < reply.max_tokens
        return ("model_context_window_exceeded" if lowered else "max_tokens"), None
    if isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


def usage(chat_usage: dict[str, Any] | None, warm_up: bool = False) -> dict[str, Any]:
    u = chat_usage or {}
    prompt = int(u.get("prompt_tokens") or 0)
    cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": 0 if warm_up else int(u.get("completion_tokens") or 0),
    }


def cache_miss_reason(cache: dict[str, Any] | None, compare_with: str | None) -> dict[str, Any] | None:
    """Anthropic's ``cache_miss_reason`` for our cache report (None: nothing in the request changed)."""
    if compare_with is None or not cache:
        return None
    kind = cache.get("type")
    if kind == "unavailable" and cache.get("compared_with") == compare_with:
        return {"type": "previous_message_not_found"}
    mapped = MISS_TYPES.get(str(kind))
    if mapped is None:
        return None
    if mapped == "unavailable":
        return {"type": "unavailable"}
    return {"type": mapped, "cache_missed_input_tokens": int(cache.get("missed_tokens") or 0)}


def extensions(reply: Reply, chat: dict[str, Any], incomplete: Any = None) -> dict[str, Any]:
    """Our fields on a Message / message_delta: diagnostics, cache, tool_state, clamp, drops, cut call."""
    ext: dict[str, Any] = {}
    if reply.diagnostics:
        ext["diagnostics"] = {"cache_miss_reason": cache_miss_reason(chat.get("cache"), reply.compare_with)}
    for key in ("cache", "tool_state", "max_tokens_clamped"):
        if chat.get(key) is not None:
            ext[key] = chat[key]
    if reply.dropped_tools:
        ext["dropped_tools"] = reply.dropped_tools
    if incomplete is not None:
        ext["incomplete_tool_call"] = incomplete
    return ext


def tool_input(arguments: str) -> Any:
    """A call's arguments as the ``input`` object (the masks make them a JSON object)."""
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {"arguments": arguments}  # not reachable under the masks; never dropped


def tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    return {
        "type": "tool_use",
        "id": ids.tool_use_id(call["id"]),
        "name": fn["name"],
        "input": tool_input(fn["arguments"]),
    }


def signature(thinking: str) -> str:
    """A thinking block's ``signature`` (the SDK requires one): a digest of its text, nothing secret.
    Sent back, it is accepted and not checked; the thinking text is what renders."""
    return "agentserve-sha256:" + hashlib.sha256(thinking.encode()).hexdigest()


def thinking_block(thinking: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": thinking, "signature": signature(thinking)}


def message(p: Prepared, reply: Reply, chat: dict[str, Any]) -> dict[str, Any]:
    """The Message for a (non-streamed) chat completion."""
    choice = chat["choices"][0]
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if reply.warm_up:
        msg = {}  # the one decoded token is not part of a warm-up's reply
    if msg.get("reasoning_content"):
        content.append(thinking_block(msg["reasoning_content"]))
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    content += [tool_use_block(c) for c in msg.get("tool_calls") or []]
    reason, sequence = stop_reason(p, reply, choice.get("finish_reason"), choice.get("stop_reason"))
    return {
        "id": ids.message_id(chat["id"]),
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(chat.get("usage"), reply.warm_up),
        **extensions(reply, chat, None if reply.warm_up else choice.get("incomplete_tool_call")),
    }
