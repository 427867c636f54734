"""The shortest complete call of a tool, in tokens: is there budget left to start another call?

``ToolMatcher`` gets the request's token budget (``max_tokens``) and, after a call,
allows a further (parallel) call only while the remaining budget can hold the shortest
complete call of an allowed tool. A call that cannot finish would only be cut (and
reported as ``incomplete_tool_call``), never executed.

The shortest call is the envelope's text of a call whose arguments are the smallest JSON
value the schema accepts (required properties only; "" / 0 / false / [] / null; the
shortest ``enum`` / ``const``; ``minLength`` / ``minItems`` respected), tokenized by the
model's tokenizer. That is the canonical tokenization, not a proof of the minimum: a model
could in principle spell the same text in fewer, longer tokens, but the masks make it
write canonical JSON, which the tokenizer splits this way.

Never materialized: a schema's ``minLength: 10**9`` is a number, not a gigabyte of text, and
nested ``minItems`` never multiply into what is built. One pass computes the full value's JSON
length arithmetically and builds a sample of it at most ``BUILD_CHARS`` characters long (each
repetition capped at ``REPEAT_CAP``, a nested level given its share of the budget), so four
nested arrays of ``minItems: 64`` (a 255-byte schema, 64**4 elements in full) cost a sample of
a few KB, not 229 s and 16 GiB. When the sample is shorter than the full value, its token count
is scaled by the ratio of the lengths (repeated text tokenizes periodically). Results are
cached per (tokenizer, envelope, tool name, schema digest), a bounded LRU.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any

from server.families.envelope import Envelope

_SCALAR = {"string": "", "integer": 0, "number": 0, "boolean": False, "null": None}
REPEAT_CAP = 64  # repetitions of an over-budget value written out; the rest are counted, not built
BUILD_CHARS = 4096  # the longest sample of the shortest arguments ever built (and tokenized)
_FLOOR = 16  # the least budget a nested level gets
_MAX_DEPTH = 8
_SEP = (", ", ": ")


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=_SEP)


def _count(schema: dict[str, Any], key: str) -> int:
    value = schema.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _kind(schema: dict[str, Any]) -> Any:
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0] if kind else "object"
    return kind


def _alternatives(schema: dict[str, Any]) -> list[Any] | None:
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return list(schema[key])
    return None


def _shortest_enum(schema: dict[str, Any]) -> Any:
    return min(schema["enum"], key=lambda v: len(_dumps(v)))


def _number(schema: dict[str, Any]) -> Any:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    return low if isinstance(low, int | float) and not isinstance(low, bool) and low > 0 else 0


def _required(schema: dict[str, Any]) -> list[tuple[str, Any]]:
    props = schema.get("properties") or {}
    props = props if isinstance(props, dict) else {}
    required = [k for k in schema.get("required") or [] if isinstance(k, str)]
    return [(k, props.get(k, {})) for k in dict.fromkeys(required)]


def _length(schema: Any, depth: int) -> int:
    """The smallest value's JSON length, by arithmetic only (nothing built but enum/const values,
    which are part of the schema)."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return 2
    if "const" in schema:
        return len(_dumps(schema["const"]))
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return len(_dumps(_shortest_enum(schema)))
    alternatives = _alternatives(schema)
    if alternatives is not None:
        return min(_length(s, depth + 1) for s in alternatives)
    kind = _kind(schema)
    if kind == "string":
        return _count(schema, "minLength") + 2
    if kind in ("integer", "number"):
        return len(_dumps(_number(schema)))
    if kind == "array":
        n = _count(schema, "minItems")
        return 2 + n * _length(schema.get("items", {}), depth + 1) + max(0, n - 1) * len(_SEP[0])
    if kind == "object":
        parts = _required(schema)
        inner = sum(len(_dumps(k)) + len(_SEP[1]) + _length(v, depth + 1) for k, v in parts)
        return 2 + inner + max(0, len(parts) - 1) * len(_SEP[0])
    return len(_dumps(_SCALAR.get(kind, {})))


def _build(schema: Any, depth: int, budget: int, cap: int) -> Any:
    """The smallest value itself when its JSON fits ``budget`` characters, else a sample of it
    (repetitions cut to fit, at most ``cap`` each) about ``budget`` long."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return {}
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return _shortest_enum(schema)
    alternatives = _alternatives(schema)
    if alternatives is not None:
        best = min(alternatives, key=lambda s: _length(s, depth + 1))
        return _build(best, depth + 1, budget, cap)
    kind = _kind(schema)
    fits = _length(schema, depth) <= budget
    if kind == "string":
        n = _count(schema, "minLength")
        return "a" * (n if fits else max(0, min(n, budget - 2)))
    if kind in ("integer", "number"):
        return _number(schema)
    if kind == "array":
        n, items = _count(schema, "minItems"), schema.get("items", {})
        if not n:
            return []
        if fits:
            return [_build(items, depth + 1, budget, cap)] * n
        item_len = min(_length(items, depth + 1), budget)
        reps = max(1, min(n, cap, budget // (item_len + len(_SEP[0]))))
        return [_build(items, depth + 1, max(_FLOOR, budget // reps), cap)] * reps
    if kind == "object":
        parts = _required(schema)
        share = budget if fits else max(_FLOOR, budget // max(1, len(parts)))
        return {k: _build(v, depth + 1, share, cap) for k, v in parts}
    return _SCALAR.get(kind, {})


def minimal_value(schema: Any, cap: int = REPEAT_CAP, budget: int = BUILD_CHARS) -> Any:
    """The smallest JSON value ``schema`` accepts (best effort; {} when unknown) when its JSON is
    at most ``budget`` characters; past that a sample of it, never much longer than ``budget``
    (each ``minLength`` / ``minItems`` repetition cut, to at most ``cap`` for arrays)."""
    return _build(schema, 0, budget, cap)


def minimal_json_length(schema: Any) -> int:
    """Characters of the smallest value's JSON (``minimal_call_text``'s spacing), by arithmetic."""
    return _length(schema, 0)


def minimal_call_text(envelope: Envelope, name: str, parameters: dict[str, Any] | None) -> str:
    """The text of a further call (after a first one) to ``name`` with minimal arguments (a
    sample of them when they are longer than ``BUILD_CHARS``)."""
    args = envelope.arguments_text(_dumps(minimal_value(parameters or {"type": "object"})))
    call_id = "a" * 9 if envelope.call_id else ""
    return envelope.next_opening + name + envelope.close_text(call_id) + args + envelope.end_text(call_id)


def minimal_call_tokens(
    tokenizer: Any, envelope: Envelope, tools: list[dict[str, Any]], allowed: tuple[str, ...]
) -> int:
    """Tokens of the shortest complete further call of any allowed tool (0 with none allowed)."""
    by_name = {t["function"]["name"]: t["function"].get("parameters") for t in tools}
    counts = [_call_tokens(tokenizer, envelope, n, by_name.get(n)) for n in allowed if n in by_name]
    return min(counts, default=0)


_CACHE: OrderedDict[tuple[Any, Envelope, str, str], int] = OrderedDict()
_CACHE_SIZE = 4096  # entries of a few dozen bytes each (a schema is keyed by its digest, not its text)
_LOCK = threading.Lock()


def _call_tokens(tokenizer: Any, envelope: Envelope, name: str, parameters: dict[str, Any] | None) -> int:
    schema_json = _dumps(parameters)
    key = (tokenizer, envelope, name, hashlib.sha256(schema_json.encode()).hexdigest())
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    count = _estimate(tokenizer, envelope, name, parameters)
    with _LOCK:
        _CACHE[key] = count
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return count


def _estimate(tokenizer: Any, envelope: Envelope, name: str, parameters: dict[str, Any] | None) -> int:
    text = minimal_call_text(envelope, name, parameters)
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    schema = parameters or {"type": "object"}
    full, built = minimal_json_length(schema), len(_dumps(minimal_value(schema)))
    if full <= built:
        return tokens
    # the arguments are longer than BUILD_CHARS: scale the sample call's tokens to the full length
    return -(-tokens * (len(text) - built + full) // len(text))
