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
"""

from __future__ import annotations

import json
from typing import Any

from server.families.envelope import Envelope

_SCALAR = {"string": "", "integer": 0, "number": 0, "boolean": False, "null": None}


def minimal_value(schema: Any, depth: int = 0) -> Any:
    """The smallest JSON value ``schema`` accepts (best effort; {} when unknown)."""
    if not isinstance(schema, dict) or depth > 8:
        return {}
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return min(schema["enum"], key=lambda v: len(json.dumps(v)))
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            options = [minimal_value(s, depth + 1) for s in schema[key]]
            return min(options, key=lambda v: len(json.dumps(v)))
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0] if kind else "object"
    if kind == "string":
        return "a" * int(schema.get("minLength", 0) or 0)
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        return low if isinstance(low, int | float) and low > 0 else 0
    if kind == "array":
        item = minimal_value(schema.get("items", {}), depth + 1)
        return [item] * int(schema.get("minItems", 0) or 0)
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: minimal_value(props.get(k, {}), depth + 1) for k in schema.get("required") or []}
    return _SCALAR.get(kind, {})


def minimal_call_text(envelope: Envelope, name: str, parameters: dict[str, Any] | None) -> str:
    """The text of a further call (after a first one) to ``name`` with minimal arguments."""
    args = json.dumps(minimal_value(parameters or {"type": "object"}), separators=(", ", ": "))
    if envelope.arguments == "xml_parameters":
        from server.families.xml_arguments import render_xml_arguments

        args = render_xml_arguments(args)
    call_id = "a" * 9 if envelope.call_id else ""
    return envelope.next_opening + name + envelope.name_close + args + envelope.end_text(call_id)


def minimal_call_tokens(
    tokenizer: Any, envelope: Envelope, tools: list[dict[str, Any]], allowed: tuple[str, ...]
) -> int:
    """Tokens of the shortest complete further call of any allowed tool (0 with none allowed)."""
    by_name = {t["function"]["name"]: t["function"].get("parameters") for t in tools}
    counts = [
        len(tokenizer(minimal_call_text(envelope, n, by_name.get(n)), add_special_tokens=False)["input_ids"])
        for n in allowed
        if n in by_name
    ]
    return min(counts, default=0)
