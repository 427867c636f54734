"""The shortest complete call of a tool, in tokens: is there budget left to start another call?

``ToolConstraint`` gets the request's token budget (``max_tokens``) and, after a call,
allows a further (parallel) call only while the remaining budget can hold the shortest
complete call of an allowed tool. A call that cannot finish would only be cut (and
reported as ``incomplete_tool_call``), never executed.

The shortest call is the envelope's text of a call whose arguments are the smallest JSON
value the schema accepts (required properties only; "" / 0 / false / [] / null; the
shortest ``enum`` / ``const``; ``minLength`` / ``minItems`` respected), tokenized by the
model's tokenizer. That is the canonical tokenization, not a proof of the minimum: a model
could in principle spell the same text in fewer, longer tokens, but the masks make it
write canonical JSON, which the tokenizer splits this way.

Never materialized: a schema's ``minLength: 10**9`` is a number, not a gigabyte of text.
The value is built with every repetition capped at ``REPEAT_CAP`` and its full length
computed arithmetically alongside; when the capped text is shorter than the full one, its
token count is scaled by the ratio of the lengths (repeated text tokenizes periodically).
Results are cached per (tokenizer, envelope, tool name, schema).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from server.families.envelope import Envelope

_SCALAR = {"string": "", "integer": 0, "number": 0, "boolean": False, "null": None}
REPEAT_CAP = 64  # repetitions written out; longer ones are counted, not built
_SEP = (", ", ": ")


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=_SEP)


def _count(schema: dict[str, Any], key: str) -> int:
    value = schema.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _minimal(schema: Any, depth: int, cap: int) -> tuple[Any, int]:
    """(the smallest value with repetitions capped at ``cap``, the full value's JSON length)."""
    if not isinstance(schema, dict) or depth > 8:
        return {}, 2
    if "const" in schema:
        return schema["const"], len(_dumps(schema["const"]))
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        best = min(schema["enum"], key=lambda v: len(_dumps(v)))
        return best, len(_dumps(best))
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return min((_minimal(s, depth + 1, cap) for s in schema[key]), key=lambda vl: vl[1])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0] if kind else "object"
    if kind == "string":
        n = _count(schema, "minLength")
        return "a" * min(n, cap), n + 2
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        value = low if isinstance(low, int | float) and not isinstance(low, bool) and low > 0 else 0
        return value, len(_dumps(value))
    if kind == "array":
        item, item_len = _minimal(schema.get("items", {}), depth + 1, cap)
        n = _count(schema, "minItems")
        return [item] * min(n, cap), 2 + n * item_len + max(0, n - 1) * len(_SEP[0])
    if kind == "object":
        props = schema.get("properties") or {}
        required = [k for k in schema.get("required") or [] if isinstance(k, str)]
        parts = {k: _minimal(props.get(k, {}), depth + 1, cap) for k in required}
        length = 2 + sum(len(_dumps(k)) + len(_SEP[1]) + v[1] for k, v in parts.items())
        return {k: v[0] for k, v in parts.items()}, length + max(0, len(parts) - 1) * len(_SEP[0])
    scalar: Any = _SCALAR.get(kind, {})
    return scalar, len(_dumps(scalar))


def minimal_value(schema: Any, cap: int = REPEAT_CAP) -> Any:
    """The smallest JSON value ``schema`` accepts (best effort; {} when unknown), with every
    ``minLength`` / ``minItems`` repetition capped at ``cap``."""
    return _minimal(schema, 0, cap)[0]


def minimal_json_length(schema: Any) -> int:
    """Characters of the smallest value's JSON (``minimal_call_text``'s spacing), uncapped, by arithmetic."""
    return _minimal(schema, 0, 0)[1]


def minimal_call_text(envelope: Envelope, name: str, parameters: dict[str, Any] | None) -> str:
    """The text of a further call (after a first one) to ``name`` with minimal arguments."""
    args = _dumps(minimal_value(parameters or {"type": "object"}))
    if envelope.arguments == "xml_parameters":
        from server.families.xml_arguments import render_xml_arguments

        args = render_xml_arguments(args)
    call_id = "a" * 9 if envelope.call_id else ""
    return envelope.next_opening + name + envelope.close_text(call_id) + args + envelope.end_text(call_id)


def minimal_call_tokens(
    tokenizer: Any, envelope: Envelope, tools: list[dict[str, Any]], allowed: tuple[str, ...]
) -> int:
    """Tokens of the shortest complete further call of any allowed tool (0 with none allowed)."""
    by_name = {t["function"]["name"]: t["function"].get("parameters") for t in tools}
    counts = [_call_tokens(tokenizer, envelope, n, _dumps(by_name.get(n))) for n in allowed if n in by_name]
    return min(counts, default=0)


@functools.lru_cache(maxsize=4096)
def _call_tokens(tokenizer: Any, envelope: Envelope, name: str, parameters_json: str) -> int:
    parameters = json.loads(parameters_json)
    text = minimal_call_text(envelope, name, parameters)
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    schema = parameters or {"type": "object"}
    full, capped = minimal_json_length(schema), len(_dumps(minimal_value(schema)))
    if full <= capped:
        return tokens
    # the arguments are repetitions longer than REPEAT_CAP: scale the capped call's tokens
    return -(-tokens * (len(text) - capped + full) // len(text))
