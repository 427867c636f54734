"""Parse generated text into OpenAI content + tool_calls, whole or as a stream of deltas.

A call is the envelope's ``<tool_call> … </tool_call>`` block holding a JSON object
``{"name": …, "arguments": {…}}``. A block that does not parse stays in the content,
so nothing the model wrote is lost. The streaming parser emits content as soon as it
cannot be the start of a call tag, and each call once its block is closed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from server.families.envelope import Envelope
from server.session_key import canonical_json


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class ParsedOutput:
    content: str | None
    tool_calls: tuple[ParsedCall, ...]


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class CallDelta:
    index: int
    call: ParsedCall


def parse_call_body(body: str) -> ParsedCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], canonical_json(args))


class StreamingToolCallParser:
    def __init__(self, envelope: Envelope) -> None:
        self.open_tag = envelope.call_tag
        self.close_tag = envelope.call_close_tag
        self._buf = ""
        self._in_call = False
        self.calls: list[ParsedCall] = []
        self.content_parts: list[str] = []

    def feed(self, text: str) -> list[ContentDelta | CallDelta]:
        self._buf += text
        events: list[ContentDelta | CallDelta] = []
        while True:
            if not self._in_call:
                at = self._buf.find(self.open_tag)
                if at < 0:
                    keep = _partial_suffix(self._buf, self.open_tag)
                    self._emit_content(self._buf[: len(self._buf) - keep], events)
                    self._buf = self._buf[len(self._buf) - keep :]
                    return events
                self._emit_content(self._buf[:at], events)
                self._buf = self._buf[at:]
                self._in_call = True
            end = self._buf.find(self.close_tag)
            if end < 0:
                return events
            block = self._buf[: end + len(self.close_tag)]
            self._buf = self._buf[end + len(self.close_tag) :]
            self._in_call = False
            call = parse_call_body(block[len(self.open_tag) : end].strip())
            if call is None:
                self._emit_content(block, events)
            else:
                self.calls.append(call)
                events.append(CallDelta(len(self.calls) - 1, call))

    def finish(self) -> list[ContentDelta | CallDelta]:
        """Flush what is left (an unclosed call block stays content: nothing is dropped)."""
        events: list[ContentDelta | CallDelta] = []
        self._emit_content(self._buf, events)
        self._buf = ""
        self._in_call = False
        return events

    def _emit_content(self, text: str, events: list[ContentDelta | CallDelta]) -> None:
        if text:
            self.content_parts.append(text)
            events.append(ContentDelta(text))

    def result(self) -> ParsedOutput:
        content = "".join(self.content_parts)
        if self.calls:
            content = content.strip()
        return ParsedOutput(content or None, tuple(self.calls))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def parse_tool_calls(text: str, envelope: Envelope) -> ParsedOutput:
    parser = StreamingToolCallParser(envelope)
    parser.feed(text)
    parser.finish()
    return parser.result()
