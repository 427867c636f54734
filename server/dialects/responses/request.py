"""A Responses request body → a chat-shaped dict (``ChatCompletionRequest`` input).

Keys are visited in the client's order, so the chat dict keeps it (the session key and the
cache report read it). Mapping (what is accepted, and where it goes):

- ``input`` (a string, or items) → ``messages``; ``instructions`` → a leading ``system``
  message; the stored conversation of ``previous_response_id`` goes before ``input``.
- items: ``message`` (roles user / developer / system / assistant; content a string or
  ``input_text`` / ``output_text`` / ``text`` / ``refusal`` parts, joined in order),
  ``function_call`` / ``custom_tool_call`` (→ the preceding assistant message's ``tool_calls``),
  ``function_call_output`` / ``custom_tool_call_output`` (→ ``tool`` messages), ``reasoning``
  (ours carry the reasoning text: it becomes the next assistant turn's ``reasoning_content``;
  others are opaque carriers kept in the store, not rendered), ``compaction`` (made by
  ``/v1/responses/compact`` here: a user message with its summary, see compact.py). Anything else
  is a 400.
- ``tool_choice: "auto"`` is the Responses default (Codex always sends it): it is treated as
  no choice, so the deployment's tool state machine applies (``agent``, the default, allows
  what ``auto`` allows on a new user message); any other tool_choice is explicit and wins.
- ``max_output_tokens`` → ``max_tokens``; none (or null) → ``max_tokens_default: "window"``: the
  reply may use the rest of the window, as OpenAI grants the model's maximum (never the server's
  ``default_max_tokens``, which would end it ``incomplete``); ``text.format`` → ``response_format``;
  ``tools`` / ``tool_choice`` → see ``tools.py``; ``prompt_cache_options`` (the diagnostics'
  ``comparison_response_id``), ``temperature``, ``top_p``, ``parallel_tool_calls``, ``user``,
  ``prompt_cache_key``, ``prompt_cache_retention`` (a retention hint for the session's KV:
  ``"24h"`` keeps it up to ``prefix_cache.session_cap_s`` after a reply), a content part's
  ``prompt_cache_breakpoint`` (its ttl is a hint too: ``prompt_cache_breakpoints``), ``stream``,
  ``tool_state_machine``, ``cache_compare_with``, ``top_logprobs`` pass through.
- Accepted, no effect on the tokens: ``store`` and ``previous_response_id`` (used here),
  ``metadata`` (echoed), ``include``; ``reasoning.effort`` → ``reasoning_effort`` (a reasoning
  family's budget, see server/chat/reasoning_reply.py; no effect on other families),
  ``client_metadata``, ``service_tier``, ``safety_identifier``,
  ``background: false``, ``truncation`` ("auto" never truncates here: a prompt over the
  window stays a 400).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from server.dialects.responses.compact import SUMMARY_HEADER, summary_of
from server.dialects.responses.fields import (
    NO_EFFECT,
    PASS_THROUGH,
    REFUSED,
    check_echoed,
    check_metadata,
    check_refused,
)
from server.dialects.responses.tools import ToolNames, convert_tool_choice, convert_tools, flat_name
from server.errors import InvalidRequest

ROLES = ("user", "developer", "system", "assistant")
TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
ITEM_TYPES = (
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
    "compaction",
)


@dataclass
class Converted:
    """The chat-shaped dict and what the response side needs to map the reply back."""

    chat: dict[str, Any]
    names: ToolNames
    input_items: list[Any] = field(default_factory=list)  # the conversation as sent (stored chain + input)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content must be a string or a list of text parts", param=where)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        value = part.get(key) if key is not None and isinstance(part, dict) else None
        if not isinstance(value, str):
            raise InvalidRequest(
                f"{where}.content[{j}] has type {kind!r}: this server takes text only "
                f"({', '.join(TEXT_PARTS)} parts with their text)",
                param=f"{where}.content[{j}]",
            )
        out.append(value)
    return "".join(out)


def _need(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidRequest(
            f"{where} ({item.get('type')}) needs a string {key!r}: replay the item as the server sent it",
            param=f"{where}.{key}",
        )
    return value


def _call_holder(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool_calls list of the assistant message a replayed call belongs to (new one if none)."""
    last = messages[-1] if messages else None
    if last is None or last["role"] != "assistant":
        last = {"role": "assistant", "content": None}
        messages.append(last)
    calls: list[dict[str, Any]] = last.setdefault("tool_calls", [])
    return calls


def _reasoning_only(message: dict[str, Any]) -> bool:
    """An assistant message made from a reasoning item, with no answer or calls yet."""
    return (
        message["role"] == "assistant"
        and "reasoning_content" in message
        and message.get("content") is None
        and not message.get("tool_calls")
    )


def items_to_messages(items: list[Any], names: ToolNames) -> list[dict[str, Any]]:
    """Responses input items → chat messages (400 naming the item on anything malformed)."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} is not an item object", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise InvalidRequest(
                    f"{where}.role {role!r} is not one of {list(ROLES)}", param=f"{where}.role"
                )
            text = _text(item.get("content"), where)
            last = messages[-1] if messages else None
            if role == "assistant" and last is not None and _reasoning_only(last):
                last["content"] = text  # the answer after its reasoning item: one assistant turn
            else:
                messages.append({"role": role, "content": text})
        elif kind == "function_call":
            name = _need(item, "name", where)
            ns = item.get("namespace")
            chat_name = flat_name(ns, name) if isinstance(ns, str) and ns else name
            fn = {"name": chat_name, "arguments": _need(item, "arguments", where)}
            _call_holder(messages).append(
                {"id": _need(item, "call_id", where), "type": "function", "function": fn}
            )
        elif kind == "custom_tool_call":
            name = _need(item, "name", where)
            ns = item.get("namespace")
            chat_name = flat_name(ns, name) if isinstance(ns, str) and ns else name
            custom = {"name": chat_name, "input": _need(item, "input", where)}
            _call_holder(messages).append(
                {"id": _need(item, "call_id", where), "type": "custom", "custom": custom}
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = _need(item, "call_id", where)
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":
            # our reasoning items carry the text (reasoning_text content): the next assistant turn's
            # reasoning; others (encrypted_content, summaries only) are kept in the store, not rendered
            found = item.get("content")
            parts: list[Any] = found if isinstance(found, list) else []
            text = "".join(p.get("text") or "" for p in parts if isinstance(p, dict))
            if text:
                messages.append({"role": "assistant", "content": None, "reasoning_content": text})
        elif kind == "compaction":  # made by /v1/responses/compact here: the summary (compact.py)
            messages.append({"role": "user", "content": SUMMARY_HEADER + summary_of(item, where)})
        else:
            raise InvalidRequest(
                f"{where} has type {kind!r}, which this server does not take: send one of {list(ITEM_TYPES)} "
                "(item_reference: send the item itself, or use previous_response_id)",
                param=f"{where}.type",
            )
    return messages


def _input_items(body: dict[str, Any]) -> list[Any]:
    value = body.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return value
    raise InvalidRequest("input is required: a string, or a list of input items", param="input")


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidRequest(
            "text.format must be {'type': 'text'}, {'type': 'json_object'} or "
            "{'type': 'json_schema', 'name': ..., 'schema': {...}}",
            param="text.format",
        )
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    schema = {k: v for k, v in fmt.items() if k != "type"}
    return {"type": "json_schema", "json_schema": schema}


def to_chat(body: dict[str, Any], history: list[Any] | None = None) -> Converted:
    """A Responses body (+ the stored conversation of previous_response_id) → the chat dict."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object with 'model' and 'input'")
    check_refused(body)
    check_metadata(body.get("metadata"))
    check_echoed(body)
    chat: dict[str, Any] = {}
    names = ToolNames()
    if "tools" in body and body["tools"] is not None:
        tools, names = convert_tools(body["tools"])
    items = list(history or []) + _input_items(body)
    for key, value in body.items():
        if key in ("input", "instructions"):
            if "messages" in chat:
                continue
            messages = items_to_messages(items, names)
            instructions = body.get("instructions")
            if isinstance(instructions, str) and instructions:
                messages.insert(0, {"role": "system", "content": instructions})
            elif instructions is not None and not isinstance(instructions, str):
                raise InvalidRequest("instructions must be a string", param="instructions")
            chat["messages"] = messages
        elif key == "tools":
            if value is not None:
                chat["tools"] = tools
        elif key == "tool_choice":
            if value != "auto":  # "auto" is the Responses default: the deployment's state machine decides
                chat["tool_choice"] = convert_tool_choice(value, names)
        elif key == "max_output_tokens":
            chat["max_tokens"] = value
        elif key == "reasoning":  # effort → the chat's reasoning_effort (a family that reasons uses it)
            effort = value.get("effort") if isinstance(value, dict) else None
            if effort is not None:
                chat["reasoning_effort"] = effort
        elif key == "text":
            fmt = _response_format(value)
            if fmt is not None:
                chat["response_format"] = fmt
        elif key in PASS_THROUGH:
            chat[key] = value
        elif key in NO_EFFECT or key in REFUSED:
            continue
        else:
            chat[key] = value  # unknown: the chat checks accept-and-log or refuse it by name
    if "messages" not in chat:
        _input_items(body)  # raises: no input
    if chat.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    if chat.get("max_tokens") is None:  # OpenAI grants the model's maximum: here, the rest of the window
        chat["max_tokens_default"] = "window"
    breakpoints = _breakpoints(items)
    if breakpoints:  # retention hints (their ttl); the parts' text is joined into one chat message
        chat["prompt_cache_breakpoints"] = breakpoints
    return Converted(chat, names, items)


def _breakpoints(items: list[Any]) -> list[dict[str, Any]]:
    """The ``prompt_cache_breakpoint`` of each content part of the conversation, in order."""
    found = []
    for i, item in enumerate(items):
        content = item.get("content") if isinstance(item, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            bp = part.get("prompt_cache_breakpoint") if isinstance(part, dict) else None
            if bp is None:
                continue
            if (
                not isinstance(bp, dict)
                or bp.get("ttl") not in (None, "30m", "12h")
                or bp.get("mode") not in (None, "explicit")
            ):
                raise InvalidRequest(
                    f"input[{i}].content[{j}].prompt_cache_breakpoint must be an object with an optional "
                    "ttl of '30m' or '12h' (and mode 'explicit')",
                    param=f"input[{i}].content[{j}].prompt_cache_breakpoint",
                )
            found.append(bp)
    return found
