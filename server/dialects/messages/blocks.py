"""Anthropic ``system``, ``messages`` and ``tools`` -> chat messages and tools (what the model sees).

Rendering rules (see docs/api.md "Anthropic Messages"):
- a string and a list of text blocks render alike: the texts joined by ``TEXT_JOIN`` (so a
  one-text-block list is exactly its string); ``cache_control`` and ``citations`` are not rendered;
- Claude Code's ``x-anthropic-billing-header: …`` line in ``system`` is billing metadata for
  Anthropic's API, not an instruction: it is not rendered (as vLLM does), so a header that changes
  per request or per version never costs the prefix cache;
- ``thinking`` blocks in the history become the turn's ``reasoning_content`` (a reasoning family
  renders it as its template does; other families do not); ``redacted_thinking`` is not rendered;
- a ``tool_result`` becomes a chat ``tool`` message (``is_error`` is not rendered: the result's
  text is what the model reads); ``tool_use`` becomes an assistant tool call;
- a ``role: "system"`` message inside ``messages`` is a system message at that position;
- every client tool is rendered, ``defer_loading`` ones too (the tool list stays the same all
  session long, which keeps the prefix cache; a ``tool_reference`` in a tool result is shown as sent).
Anything the model cannot read (images, PDFs, unknown block types) is a 400 saying how to fix it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from server.dialects.messages import ids
from server.errors import InvalidRequest
from server.log_budget import REQUEST_LOG, cut
from server.session_key import canonical_json

log = logging.getLogger(__name__)

TEXT_JOIN = "\n"
BILLING_PREFIX = "x-anthropic-billing-header:"
HISTORY_ONLY = frozenset({"thinking", "redacted_thinking"})  # accepted, not rendered
USER_TYPES = ("text", "tool_result", "document")
ASSISTANT_TYPES = ("text", "tool_use", "thinking", "redacted_thinking")
_warned: set[str] = set()  # server-tool types warned about (once each, the first MAX_WARNED)
MAX_WARNED = 64


def bad(where: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: {message}", param=where)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad(where, "content must be a string or a list of content blocks")
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad(
                f"{where}[{i}]",
                'a content block is an object with a "type" (e.g. {"type": "text", "text": "…"})',
            )
    return content


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad(where, 'a text block needs a string "text"')
    return text


def _unsupported(kind: str, where: str, allowed: tuple[str, ...]) -> InvalidRequest:
    if kind == "image":
        return bad(
            where,
            "image blocks are not supported: this model reads text only; describe the image in a text block",
        )
    if kind in ("document", "search_result"):
        return bad(
            where, f"{kind} blocks are supported only with a plain-text source: send the text in a text block"
        )
    return bad(where, f"block type {kind!r} is not supported here: use one of {list(allowed)}")


def strip_billing(text: str) -> str:
    """``text`` without its ``x-anthropic-billing-header:`` lines."""
    if BILLING_PREFIX not in text:
        return text
    return "\n".join(line for line in text.split("\n") if not line.startswith(BILLING_PREFIX))


def system_text(system: Any) -> str:
    """The top-level ``system`` (a string or text blocks) as one text, billing header removed."""
    if system is None:
        return ""
    texts = []
    for i, block in enumerate(_blocks(system, "system")):
        where = f"system[{i}]" if isinstance(system, list) else "system"
        if block["type"] != "text":
            raise bad(where, f"system takes text blocks only, not {block['type']!r}")
        text = _text(block, where)
        clean = strip_billing(text)
        if clean != text and not clean.strip():
            continue  # a block that was only the billing header
        texts.append(clean)
    return TEXT_JOIN.join(texts)


def _document_text(block: dict[str, Any], where: str) -> str:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "text" and isinstance(source.get("data"), str):
        return str(source["data"])
    if isinstance(source, dict) and source.get("type") == "content":
        return _texts(source.get("content"), f"{where}.source.content")
    raise _unsupported("document", where, USER_TYPES)


def _texts(content: Any, where: str) -> str:
    """Content that must be text only (a tool result, a document's content)."""
    if content is None:
        return ""
    out = []
    for i, block in enumerate(_blocks(content, where)):
        at = f"{where}[{i}]" if isinstance(content, list) else where
        if block["type"] == "text":
            out.append(_text(block, at))
        elif block["type"] == "document":
            out.append(_document_text(block, at))
        elif block["type"] == "tool_reference" and isinstance(block.get("tool_name"), str):
            # tool search's answer (Claude Code's ToolSearch): every tool is always rendered here, so
            # the reference is shown as sent, in canonical JSON
            out.append(canonical_json({"type": "tool_reference", "tool_name": block["tool_name"]}))
        else:
            raise _unsupported(block["type"], at, ("text", "document", "tool_reference"))
    return TEXT_JOIN.join(out)


def user_messages(content: Any, where: str, open_calls: dict[str, str]) -> list[dict[str, Any]]:
    """A user message -> chat ``tool`` messages (its tool_result blocks, first) + a user message."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for i, block in enumerate(_blocks(content, where)):
        at = f"{where}[{i}]" if isinstance(content, list) else where
        kind = block["type"]
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "document":
            texts.append(_document_text(block, at))
        elif kind == "tool_result":
            if texts:
                raise bad(
                    at,
                    "tool_result blocks must come first in a user message, before any text: "
                    "move the text after them",
                )
            use_id = block.get("tool_use_id")
            if not isinstance(use_id, str) or not use_id:
                raise bad(at, 'a tool_result block needs "tool_use_id": the id of the tool_use it answers')
            if use_id not in open_calls:
                raise bad(
                    at,
                    f"tool_result for tool_use_id {use_id!r} has no tool_use block with that id in the "
                    f"previous assistant message (its tool_use ids: {sorted(open_calls)}): send each "
                    f"tool_result in the user message right after the assistant message holding its tool_use",
                )
            result = _texts(block.get("content"), f"{at}.content")
            out.append({"role": "tool", "tool_call_id": ids.call_id(use_id), "content": result})
        elif kind == "tool_use" or kind in HISTORY_ONLY:
            raise bad(at, f"{kind} blocks belong in an assistant message, not a user message")
        else:
            raise _unsupported(kind, at, USER_TYPES)
    if texts or not out:
        out.append({"role": "user", "content": TEXT_JOIN.join(texts)})
    return out


def assistant_message(content: Any, where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """An assistant message -> a chat assistant message, and its tool_use ids -> names."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for i, block in enumerate(_blocks(content, where)):
        at = f"{where}[{i}]" if isinstance(content, list) else where
        kind = block["type"]
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use":
            use_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(use_id, str) or not use_id or not isinstance(name, str) or not name:
                raise bad(at, 'a tool_use block needs a string "id" and "name", and "input" (an object)')
            if not isinstance(args, dict):
                raise bad(f"{at}.input", "the input of a tool_use block must be a JSON object")
            names[use_id] = name
            arguments = json.dumps(args, ensure_ascii=False)
            call = {
                "id": ids.call_id(use_id),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            calls.append(call)
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thoughts.append(block["thinking"])  # the turn's reasoning (a reasoning family renders it)
        elif kind in HISTORY_ONLY:
            continue  # redacted reasoning: accepted, not rendered
        elif kind == "tool_result":
            raise bad(at, "tool_result blocks belong in a user message, right after the assistant's tool_use")
        else:
            raise _unsupported(kind, at, ASSISTANT_TYPES)
    msg: dict[str, Any] = {"role": "assistant", "content": TEXT_JOIN.join(texts) if texts else None}
    if calls:
        msg["tool_calls"] = calls
    if thoughts:
        msg["reasoning_content"] = TEXT_JOIN.join(thoughts)
    return msg, names


def chat_messages(system: Any, messages: list[Any]) -> list[dict[str, Any]]:
    """``system`` + ``messages`` -> chat messages (the model's view; 400s name the block)."""
    out: list[dict[str, Any]] = []
    head = system_text(system)
    if head:
        out.append({"role": "system", "content": head})
    open_calls: dict[str, str] = {}
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad(where, 'a message is an object with "role" and "content"')
        role, content = message.get("role"), message.get("content")
        if content is None:
            raise bad(f"{where}.content", "missing: send a string or a list of content blocks")
        if role == "user":
            out += user_messages(content, f"{where}.content", open_calls)
            open_calls = {}
        elif role == "assistant":
            msg, open_calls = assistant_message(content, f"{where}.content")
            out.append(msg)
        elif role == "system":
            out.append({"role": "system", "content": _texts(content, f"{where}.content")})
        else:
            raise bad(f"{where}.role", f"role {role!r} is not supported: use 'user' or 'assistant'")
    if out and out[-1]["role"] == "assistant":
        raise bad(
            f"messages[{len(messages) - 1}]",
            "the last message is from the assistant: prefilling the reply is not supported here; "
            "end with a user message",
        )
    return out


def chat_tools(tools: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Client tools -> chat function tools; Anthropic server tools (a ``type`` such as
    ``web_search_20250305``) are dropped with a warning and returned by name."""
    if tools is None:
        return [], []
    if not isinstance(tools, list):
        raise bad("tools", "tools must be a list of tool definitions")
    out, dropped = [], []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad(where, 'a tool is an object with "name", "description" and "input_schema"')
        kind = tool.get("type")
        if kind not in (None, "custom"):
            label = f"{cut(tool.get('name') or kind)} ({cut(kind)})"
            dropped.append(label)
            if cut(kind) not in _warned and len(_warned) < MAX_WARNED:
                _warned.add(cut(kind))
                REQUEST_LOG.log(
                    log,
                    logging.WARNING,
                    "dropped tool %s: this server cannot run Anthropic server tools",
                    label,
                )
            continue
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise bad(f"{where}.name", "a tool needs a non-empty string name")
        if not isinstance(schema, dict):
            raise bad(
                f"{where}.input_schema",
                'a tool needs an input_schema: a JSON schema object ({"type": "object", …})',
            )
        fn: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        fn["parameters"] = schema
        out.append({"type": "function", "function": fn})
    return out, dropped


TOOL_CHOICE_FORMS = (
    '{"type": "auto"}, {"type": "any"}, {"type": "none"} or {"type": "tool", "name": NAME}, '
    'each with an optional "disable_parallel_tool_use": true'
)


def chat_tool_choice(choice: Any) -> tuple[Any, bool]:
    """Anthropic ``tool_choice`` -> (chat ``tool_choice`` or None, ``parallel_tool_calls``)."""
    if choice is None:
        return None, True
    if not isinstance(choice, dict):
        raise bad("tool_choice", f"use {TOOL_CHOICE_FORMS}")
    parallel = not choice.get("disable_parallel_tool_use", False)
    kind = choice.get("type")
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool" and isinstance(choice.get("name"), str) and choice["name"]:
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise bad("tool_choice", f"malformed tool_choice {choice!r}: use {TOOL_CHOICE_FORMS}")
