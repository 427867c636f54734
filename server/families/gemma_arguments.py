"""Gemma 4's call arguments: ``key:value`` pairs as its chat template writes them, and back.

The template (``format_argument`` with ``escape_keys=False``) writes an argument object as
``key:value`` pairs joined by ``,`` in Jinja's ``dictsort`` order (case-insensitive), keys
bare, strings between the ``<|"|>`` special token (raw, nothing escaped), booleans ``true`` /
``false``, numbers as Python prints them, objects ``{…}`` the same way, arrays ``[a,b]``::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

``render_gemma_arguments`` writes a JSON arguments text that way (what the masks let the model
write, and what the history renders back); ``parse_gemma_arguments`` reads the text between the
call's braces back into a JSON object text (strings are always delimited, so a value's type is
its form: no schema is needed). vLLM's ``gemma4`` parser reads the same text
(tests/engines/vllm/test_gemma4_parser.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

QUOTE = '<|"|>'  # Gemma 4's string delimiter (a special token)
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")
_BARE_END = ",}]"


def sort_keys(keys: list[str]) -> list[str]:
    """Jinja's ``dictsort`` order: case-insensitive, stable."""
    return sorted(keys, key=str.lower)


def render_value(value: Any) -> str:
    """One value as the template's ``format_argument(value, escape_keys=False)`` writes it."""
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + render_pairs(value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(render_value(v) for v in value) + "]"
    return str(value)  # numbers; None as Jinja prints it ("None")


def render_pairs(obj: dict[str, Any]) -> str:
    return ",".join(f"{k}:{render_value(obj[k])}" for k in sort_keys(list(obj)))


def render_gemma_arguments(arguments_json: str) -> str:
    """A call's JSON arguments (an object) → the text between its braces."""
    obj = json.loads(arguments_json) if arguments_json.strip() else {}
    if not isinstance(obj, dict):
        raise ValueError("Gemma 4 call arguments must be a JSON object")
    return render_pairs(obj)


class _Reader:
    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def closed(self, close: str) -> bool:
        """At ``close`` (an empty close: at the end of the text)."""
        return self.text.startswith(close, self.at) if close else self.at == len(self.text)

    def pairs(self, close: str) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        if self.closed(close):
            return out
        while True:
            colon = self.text.find(":", self.at)
            if colon < 0:
                return None
            key = self.text[self.at : colon]
            if not key or any(c in key for c in ",{}[]<"):
                return None
            self.at = colon + 1
            value = self.value()
            if value is _BAD:
                return None
            out[key] = value
            if self.text.startswith(",", self.at):
                self.at += 1
                continue
            return out if self.closed(close) else None

    def items(self) -> list[Any] | None:
        out: list[Any] = []
        if self.text.startswith("]", self.at):
            return out
        while True:
            value = self.value()
            if value is _BAD:
                return None
            out.append(value)
            if self.text.startswith(",", self.at):
                self.at += 1
                continue
            return out if self.text.startswith("]", self.at) else None

    def value(self) -> Any:
        text, at = self.text, self.at
        if text.startswith(QUOTE, at):
            end = text.find(QUOTE, at + len(QUOTE))
            if end < 0:
                return _BAD
            self.at = end + len(QUOTE)
            return text[at + len(QUOTE) : end]
        if text.startswith("{", at):
            self.at += 1
            obj = self.pairs("}")
            if obj is None:
                return _BAD
            self.at += 1
            return obj
        if text.startswith("[", at):
            self.at += 1
            arr = self.items()
            if arr is None:
                return _BAD
            self.at += 1
            return arr
        end = at
        while end < len(text) and text[end] not in _BARE_END:
            end += 1
        bare, self.at = text[at:end], end
        if bare in ("true", "false"):
            return bare == "true"
        if bare == "None":
            return None
        if _NUMBER.fullmatch(bare):
            return json.loads(bare)
        return _BAD


_BAD = object()


def parse_gemma_arguments(body: str) -> dict[str, Any] | None:
    """The text between a call's braces → its arguments (None: not Gemma 4 arguments)."""
    reader = _Reader(body)
    return reader.pairs("")
