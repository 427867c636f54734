"""Qwen3-Coder's XML arguments: ``<parameter=KEY>\\nVALUE\\n</parameter>\\n`` per argument.

Written as Qwen3-Coder's chat template writes them (the current template on the
Hugging Face hub, also Qwen3.5's): for each argument in order, ``'<parameter=' + key +
'>\\n'``, then the value — a string raw, an object or array as ``tojson`` (``json.dumps``
with ``", "`` / ``": "`` separators, no ASCII escaping), anything else as Jinja's
``|string`` of the Python value (``5``, ``1.5``, ``True``, ``False``, ``None``) — then
``'\\n</parameter>\\n'``. Parsing strips that one newline on either side and types the
raw value by the tool's JSON schema (vLLM's qwen3coder parser does the same); without
a schema a value that reads as JSON (or ``True``/``False``/``None``) is typed, else kept
as a string.
"""

from __future__ import annotations

import json
import re
from typing import Any

STRICT_RE = re.compile(r"<parameter=([^>\n]*)>\n(.*?)\n</parameter>\n", re.DOTALL)
LENIENT_RE = re.compile(r"<parameter=([^>\n]*)>\n?(.*?)\n?</parameter>\n?", re.DOTALL)
_PY_WORDS = {"True": True, "False": False, "None": None}


def render_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)  # Jinja's |string of the Python value: True, None, 5, 1.5


def render_xml_arguments(arguments: str | dict[str, Any]) -> str:
    """The parameters block for a call's arguments (JSON text or a dict), in their order."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    if not isinstance(args, dict):
        raise ValueError(f"tool-call arguments must be a JSON object, got {type(args).__name__}")
    return "".join(f"<parameter={k}>\n{render_value(v)}\n</parameter>\n" for k, v in args.items())


def schema_types(schema: Any) -> set[str]:
    """The JSON types a schema allows (its ``type``, ``anyOf``/``oneOf``, a string ``enum``)."""
    if not isinstance(schema, dict):
        return set()
    t = schema.get("type")
    types = set(t) if isinstance(t, list) else {t} if isinstance(t, str) else set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            types |= schema_types(sub)
    if not types and "enum" in schema:
        types = {"string"} if all(isinstance(v, str) for v in schema["enum"]) else set()
    return types


def type_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """The JSON value of a raw parameter text, typed by its property schema."""
    types = schema_types(schema)
    if types == {"string"}:
        return raw
    if raw in _PY_WORDS and (not types or types & {"boolean", "null"}):
        return _PY_WORDS[raw]
    if raw in ("true", "false") and (not types or "boolean" in types):
        return raw == "true"
    if types & {"integer", "number", "object", "array", "null", "boolean"} or not types:
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def parse_xml_arguments(body: str, schema: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The arguments dict of a parameters block, or None when the block holds other text.

    The template's exact form first (a value ends at the first ``\\n</parameter>\\n``, which
    the masks guarantee), then a lenient reading for unmasked output (no newlines)."""
    props = (schema or {}).get("properties") or {}
    for pattern in (STRICT_RE, LENIENT_RE):
        out: dict[str, Any] = {}
        pos = 0
        for m in pattern.finditer(body):
            if body[pos : m.start()].strip():
                break
            out[m.group(1)] = type_value(m.group(2), props.get(m.group(1)))
            pos = m.end()
        else:
            if not body[pos:].strip():
                return out
    return None
