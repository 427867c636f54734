"""Deterministic prompt rendering: ChatML with Hermes tools (same messages -> same text).

The embedded model's own chat template knows no tools, so the server renders them:
a tools block (one canonical JSON line per tool) at the end of the first system
message; assistant ``tool_calls`` as envelope-wrapped canonical JSON; ``tool``
results grouped into one user turn of ``<tool_response>`` blocks (Hermes/Qwen2.5).

Determinism: JSON is serialized with sorted keys and fixed separators; nothing time-
or order-dependent is added. The rendered text carries labelled segments so a cache
miss can be explained ("system message changed at character 41").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from server.errors import InvalidRequest
from server.families.envelope import Envelope
from server.families.rendered import RenderedPrompt, Segment
from server.protocol import ChatMessage
from server.session_key import canonical_json

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
GENERATION_PROMPT = f"{IM_START}assistant\n"


def canonical_arguments(arguments: str) -> str:
    """Tool-call arguments re-serialized canonically (sorted keys) when they are JSON."""
    try:
        return canonical_json(json.loads(arguments))
    except (json.JSONDecodeError, TypeError):
        return arguments


class _Builder:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.segments: list[Segment] = []

    def add(self, text: str, label: str | None = None) -> None:
        if label is not None and text:
            self.segments.append(Segment(self.length, self.length + len(text), label))
        self.parts.append(text)
        self.length += len(text)


def render_tools_block(tools: Sequence[dict[str, Any]], envelope: Envelope) -> str:
    lines = [canonical_json(tool) for tool in tools]
    return envelope.tools_preamble + "\n" + "\n".join(lines) + "\n" + envelope.tools_postamble


def render_chat(
    messages: Sequence[ChatMessage],
    tools: Sequence[dict[str, Any]] | None,
    envelope: Envelope,
    add_generation_prompt: bool = True,
) -> RenderedPrompt:
    b = _Builder()
    tools = list(tools or [])
    tools_block = render_tools_block(tools, envelope) if tools else ""
    msgs = list(messages)
    if not msgs or msgs[0].role not in ("system", "developer"):
        b.add(f"{IM_START}system\n")
        b.add(DEFAULT_SYSTEM, "default system message")
        if tools_block:
            b.add("\n\n")
            b.add(tools_block, "tools block")
        b.add(f"{IM_END}\n")
    i = 0
    while i < len(msgs):
        msg = msgs[i]
        label = f"message {i} ({msg.role})"
        if msg.role in ("system", "developer"):
            b.add(f"{IM_START}system\n")
            b.add(_text(msg, i), "system message" if i == 0 else label)
            if i == 0 and tools_block:
                b.add("\n\n")
                b.add(tools_block, "tools block")
            b.add(f"{IM_END}\n")
        elif msg.role == "user":
            b.add(f"{IM_START}user\n")
            b.add(_text(msg, i), label)
            b.add(f"{IM_END}\n")
        elif msg.role == "assistant":
            b.add(f"{IM_START}assistant\n")
            b.add(_assistant_body(msg, envelope, i), label)
            b.add(f"{IM_END}\n")
        else:  # tool: consecutive results share one user turn
            b.add(f"{IM_START}user\n")
            first = True
            while i < len(msgs) and msgs[i].role == "tool":
                if not first:
                    b.add("\n")
                body = envelope.tool_response_open + _text(msgs[i], i) + envelope.tool_response_close
                b.add(body, f"message {i} (tool)")
                first = False
                i += 1
            b.add(f"{IM_END}\n")
            continue
        i += 1
    if add_generation_prompt:
        b.add(GENERATION_PROMPT)
    names = tuple(str(t.get("function", {}).get("name", "")) for t in tools)
    return RenderedPrompt("".join(b.parts), tuple(b.segments), names)


def _text(msg: ChatMessage, index: int) -> str:
    if isinstance(msg.content, list):
        for part in msg.content:
            if part.type != "text":
                raise InvalidRequest(
                    f"messages[{index}].content has a part of type {part.type!r}: only 'text' parts are "
                    f"supported by this model",
                    param=f"messages[{index}].content",
                )
    return msg.text()


def _assistant_body(msg: ChatMessage, envelope: Envelope, index: int) -> str:
    text = _text(msg, index)
    calls = []
    for call in msg.tool_calls or []:
        body = envelope.name_open + call.function.name + envelope.name_close
        calls.append(
            envelope.call_start + body + canonical_arguments(call.function.arguments) + envelope.call_end
        )
    if not calls:
        return text
    joined = envelope.call_separator.join(calls)
    return f"{text}\n{joined}" if text else joined
