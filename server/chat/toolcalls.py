"""Parse generated text into OpenAI content + tool_calls, whole or as a stream of deltas.

How a call looks is the envelope's (``server/families/envelope.py``); the text is the
decoded reply *with* special tokens (``[TOOL_CALLS]``, ``[ARGS]`` appear as text):

* trigger ``text`` (Hermes, Qwen3-Coder): a block from the call tag to the close tag
  (``<tool_call>`` … ``</tool_call>``) holds one call; text around blocks is content. The
  block ends at the first close tag after which its body parses (an argument may hold the
  text ``</tool_call>``), so a block that never parses stays open until ``finish``;
* trigger ``token`` (Mistral): after ``[TOOL_CALLS]`` either one JSON array of calls
  (v3, ``calls_open`` ``[TOOL_CALLS][``) or ``NAME[ARGS]{…}`` (v13; v11 ``NAME[CALL_ID]ID[ARGS]{…}``,
  the id returned as the call's), one per trigger; Harmony
  ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}`` the same way (the
  name follows the whole opening and ends at the whole ``name_close``);
* trigger ``start`` (Llama 3): the reply is a call when it begins with the opening
  (``{"name": "``), and is then one JSON object; any other reply is content.

A call that does not parse stays in the content, so nothing the model wrote is lost.
The streaming parser emits content as soon as it cannot be the start of a call, and each
call once it is complete. ``in_call`` says a call is open; ``finish`` on an open call (a
reply cut by max_tokens) leaves its text in ``unfinished`` and, unless told otherwise
(``unfinished_as_content=False``), also in the content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from server.chat.call_bodies import BodyParser, ParsedCall
from server.chat.json_scan import JsonScan
from server.chat.section_calls import name_pattern, section_step
from server.families.envelope import Envelope

__all__ = [
    "CallDelta",
    "ContentDelta",
    "ParsedCall",
    "ParsedOutput",
    "StreamingToolCallParser",
    "TextReplyParser",
    "parse_tool_calls",
    "reply_parser",
]
_DECODER = json.JSONDecoder()


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


Events = list[ContentDelta | CallDelta]


class StreamingToolCallParser:
    def __init__(self, envelope: Envelope, tools: list[dict[str, Any]] | None = None) -> None:
        self.envelope = envelope
        self.body = BodyParser(envelope, tools)
        self.trigger = envelope.trigger
        # the name ends with a special token ("[ARGS]", "[CALL_ID]") or with name_close whole when it
        # holds one after a text byte (Harmony's " <|constrain|>json<|message|>")
        self.args_token = envelope.name_close_token or (
            envelope.name_close if any(t in envelope.name_close for t in envelope.special_tokens) else None
        )
        if self.trigger == "token":
            # NAME[ARGS] calls: the name follows the whole opening (Harmony's "<|channel|>commentary
            # to=functions."; Mistral's is the trigger token alone)
            self.open_tag = envelope.opening if self.args_token else envelope.trigger_token or ""
        elif self.trigger == "start":
            self.open_tag = envelope.opening
        else:
            self.open_tag = envelope.call_tag
        self.close_tag = envelope.call_close_tag
        # a token-trigger call closed by a tag, with no name token (Gemma 4's <|tool_call>…<tool_call|>):
        # one tagged block per call, as a text trigger's
        self.tagged = self.trigger == "text" or (
            self.trigger == "token"
            and not self.args_token
            and not envelope.calls_close
            and bool(self.close_tag)
        )
        self.close_rest = _close_rest_pattern(envelope, self.args_token or "")  # v11: "ID[ARGS]", id captured
        self._buf = ""
        self._in_call = False
        self._scan: JsonScan | None = None  # the open call's JSON, scanned once (linear streaming)
        self._next_close = 0  # tagged calls: where the next close-tag candidate is searched from
        self._start_decided = False  # trigger "start": the reply is known to be text or a call
        self.calls: list[ParsedCall] = []
        self.content_parts: list[str] = []
        self.unfinished: str | None = None
        self.sectioned = envelope.sectioned  # Kimi K2, DeepSeek V3.1: server/chat/section_calls.py
        self._section_calls = 0  # calls parsed in the open section
        self._name_re = name_pattern(self)

    @property
    def in_call(self) -> bool:
        """True while the text seen so far ends inside a call that is not complete yet."""
        return self._in_call or (self.trigger == "start" and not self._start_decided and bool(self._buf))

    def feed(self, text: str) -> Events:
        self._buf += text
        events: Events = []
        while self._step(events):
            pass
        return events

    def finish(self, unfinished_as_content: bool = True) -> Events:
        """Flush what is left. An open call is ``unfinished``; by default its text stays content."""
        events: Events = []
        if self.in_call and self._buf:
            self.unfinished = self._buf
            if unfinished_as_content:
                self._emit_content(self._buf, events)
        else:
            self._emit_content(self._buf, events)
        self._buf = ""
        self._in_call = False
        return events

    def result(self) -> ParsedOutput:
        content = "".join(self.content_parts)
        if self.calls:
            content = content.strip()
        return ParsedOutput(content or None, tuple(self.calls))

    # --- one step of parsing: True when it consumed something and may go on -----------------------
    def _step(self, events: Events) -> bool:
        if self.sectioned:
            return section_step(self, events)
        if self.trigger == "start" and not self._start_decided:
            return self._decide_start(events)
        if not self._in_call:
            if self.trigger == "start":  # after the one call (or in a text reply): all content
                self._emit_content(self._buf, events)
                self._buf = ""
                return False
            at = self._buf.find(self.open_tag)
            if at < 0:
                keep = _partial_suffix(self._buf, self.open_tag)
                self._emit_content(self._buf[: len(self._buf) - keep], events)
                self._buf = self._buf[len(self._buf) - keep :]
                return False
            self._emit_content(self._buf[:at], events)
            self._buf = self._buf[at:]
            self._in_call = True
            self._scan, self._next_close = None, 0
        if self.tagged:
            return self._tagged_block(events)
        if self.trigger == "start":
            return self._json_call(self._buf, 0, events)
        if self.args_token:
            return self._name_args_call(events)
        return self._json_array(events)

    def _decide_start(self, events: Events) -> bool:
        buf, opening = self._buf, self.open_tag
        if len(buf) < len(opening) and opening.startswith(buf):
            return False  # still could be either
        self._start_decided = True
        self._in_call = buf.startswith(opening)
        return True

    def _tagged_block(self, events: Events) -> bool:
        """The shortest block up to a close tag whose body parses: a value may hold the tag itself.
        A candidate that did not parse never will (the body before it is fixed): it is not tried again."""
        end = self._buf.find(self.close_tag, max(len(self.open_tag), self._next_close))
        while end >= 0:
            call = self.body.tagged_body(self._buf[len(self.open_tag) : end])
            if call is not None:
                block = self._buf[: end + len(self.close_tag)]
                self._buf = self._buf[end + len(self.close_tag) :]
                self._in_call = False
                self._add(call, block, events)
                return True
            self._next_close = end + 1
            end = self._buf.find(self.close_tag, end + 1)
        return False  # not complete yet (or never: finish() keeps the text)

    def _json_scan(self, at: int, tag: str) -> JsonScan:
        """The open call's incremental scan of the JSON at ``at`` (one per call), advanced over the
        text fed since: whether it can be complete yet, and where a trigger outside its strings is."""
        if self._scan is None or self._scan.at != at:
            self._scan = JsonScan(at, tag)
        self._scan.advance(self._buf)
        return self._scan

    def _json_call(self, text: str, at: int, events: Events) -> bool:
        """One JSON object call at ``text[at:]`` (Llama 3: the whole reply)."""
        if not self._json_scan(at, "").closed:
            return False  # its outermost value has not closed yet: decoding it now would only fail
        try:
            obj, end = _DECODER.raw_decode(text, at)
        except json.JSONDecodeError:
            return False  # not complete yet (or never: then finish() keeps it)
        self._buf, self._in_call = text[end:], False
        self._add(self.body.json_object(obj), text[:end], events)
        return True

    def _name_args_call(self, events: Events) -> bool:
        """``[TOOL_CALLS]NAME[ARGS]{...}`` (Mistral v13); ``NAME[CALL_ID]ID[ARGS]{...}`` (v11)."""
        buf, start = self._buf, len(self.open_tag)
        assert self.args_token is not None  # only envelopes whose names end with [ARGS] come here
        cut = buf.find(self.args_token, start)
        nxt = buf.find(self.open_tag, start)
        if cut < 0 or (0 <= nxt < cut):
            return self._give_up_at(nxt, events)
        name = buf[start:cut]
        rest = self.close_rest.match(buf, cut + len(self.args_token))
        if rest is None:  # v11: the id or [ARGS] not written yet (or never: finish() keeps it)
            return self._give_up_at(nxt, events)
        call_id = rest.group(1) if rest.re.groups else None
        scan = self._json_scan(rest.end(), self.open_tag)
        try:
            if not scan.closed:
                raise json.JSONDecodeError("not closed yet", buf, rest.end())
            obj, end = _DECODER.raw_decode(buf, rest.end())
        except json.JSONDecodeError:  # a trigger's text inside a JSON string is no trigger
            return self._give_up_at(scan.tag_at, events)
        self._buf, self._in_call = buf[end:], False
        self._add(self.body.name_and_json(name, json.dumps(obj), call_id), buf[:end], events)
        return True

    def _json_array(self, events: Events) -> bool:
        """``[TOOL_CALLS][{...}, {...}]`` (Mistral v3): the calls once the array is complete."""
        buf, start = self._buf, len(self.open_tag)
        while start < len(buf) and buf[start] == " ":  # SentencePiece: [TOOL_CALLS] ▁[ (mistral:v3_spm)
            start += 1
        scan = self._json_scan(start, self.open_tag)
        try:
            if not scan.closed:
                raise json.JSONDecodeError("not closed yet", buf, start)
            arr, end = _DECODER.raw_decode(buf, start)
        except json.JSONDecodeError:
            return self._give_up_at(scan.tag_at, events)
        self._buf, self._in_call = buf[end:], False
        calls = [self.body.json_object(o) for o in arr] if isinstance(arr, list) and arr else [None]
        if any(c is None or not c.name.strip() for c in calls):
            self._emit_content(buf[:end], events)
        else:
            for call in calls:
                self._add(call, "", events)
        return True

    def _give_up_at(self, nxt: int, events: Events) -> bool:
        """An incomplete call followed by another trigger never completes: keep its text as content."""
        if nxt < 0:
            return False
        self._emit_content(self._buf[:nxt], events)
        self._buf, self._in_call, self._scan = self._buf[nxt:], False, None
        return True

    def _add(self, call: ParsedCall | None, raw: str, events: Events) -> None:
        if call is None or not call.name.strip():  # no tool has an empty name: never a call (issue 36)
            self._emit_content(raw, events)
        else:
            self.calls.append(call)
            events.append(CallDelta(len(self.calls) - 1, call))

    def _emit_content(self, text: str, events: Events) -> None:
        if text:
            self.content_parts.append(text)
            events.append(ContentDelta(text))


def _close_rest_pattern(envelope: Envelope, tok: str) -> re.Pattern[str]:
    """What follows a name's closing ``tok``: nothing (v13, Harmony), or ``ID[ARGS]`` (v11; group 1 = id)."""
    rest = envelope.name_close[len(tok) :]
    if envelope.call_id is None or "{call_id}" not in rest:
        return re.compile(re.escape(rest))
    before, after = rest.split("{call_id}")
    return re.compile(re.escape(before) + f"({envelope.call_id})" + re.escape(after))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def parse_tool_calls(
    text: str, envelope: Envelope, tools: list[dict[str, Any]] | None = None
) -> ParsedOutput:
    parser = StreamingToolCallParser(envelope, tools)
    parser.feed(text)
    parser.finish()
    return parser.result()


class TextReplyParser:
    """No envelope (``model_family: template`` with none configured): the reply is text, whatever it
    holds; no call is parsed (the model's own call syntax stays in the content, as written)."""

    in_call = False
    unfinished: str | None = None

    def __init__(self) -> None:
        self.calls: list[ParsedCall] = []
        self.content_parts: list[str] = []

    def feed(self, text: str) -> Events:
        if not text:
            return []
        self.content_parts.append(text)
        return [ContentDelta(text)]

    def finish(self, unfinished_as_content: bool = True) -> Events:
        return []

    def result(self) -> ParsedOutput:
        return ParsedOutput("".join(self.content_parts) or None, ())


def reply_parser(
    envelope: Envelope | None, tools: list[dict[str, Any]] | None = None
) -> StreamingToolCallParser | TextReplyParser:
    """The reply's parser: the envelope's calls, or text only when there is no envelope."""
    return StreamingToolCallParser(envelope, tools) if envelope is not None else TextReplyParser()
