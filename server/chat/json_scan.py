"""One streaming JSON scan: the text of a tool call's arguments scanned once as it streams in
(``JsonScan``), so the streaming parser (``toolcalls.py``) stays linear in the reply's length."""

from __future__ import annotations


class JsonScan:
    """JSON text from ``at`` scanned once as it streams in: string state, nesting depth, and the first
    ``tag`` outside its strings. An argument may hold the text ``[TOOL_CALLS]``: while the JSON is
    incomplete, only a trigger outside its strings shows that the call will never complete; and
    until the outermost value closes, decoding it can only fail. Rescanning (and re-decoding) the
    whole call on every token was quadratic: 8,000 tokens of an argument holding the trigger took
    12.5 s of event-loop time."""

    def __init__(self, at: int, tag: str) -> None:
        self.at = self.pos = at
        self.tag = tag
        self.in_string = self.escaped = False
        self.depth = 0
        self.closed = False  # the outermost value has closed (the JSON may be complete)
        self.tag_at = -1  # the first tag outside strings, or -1

    def advance(self, text: str) -> None:
        i, n, tag = self.pos, len(text), self.tag
        while i < n and self.tag_at < 0:
            c = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
                    self.closed = self.closed or self.depth <= 0  # a bare string value
            elif c == '"':
                self.in_string = True
            elif tag and c == tag[0] and text.startswith(tag[: n - i], i):
                if n - i < len(tag):
                    break  # a tag may be beginning here: decide when more text comes
                self.tag_at = i
                break
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    self.closed = True
            elif self.depth <= 0 and not c.isspace():
                self.closed = True  # a bare number / literal: let the decoder judge it, as before
            i += 1
        self.pos = i
