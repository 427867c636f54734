"""An xgrammar grammar for tagged arguments (GLM, MiniMax), generated from the tool's JSON schema.

The grammar allows exactly the text the chat template renders for arguments that fit the schema
(``server/families/tagged_arguments.py``): properties in the schema's order, each
``OPEN(KEY) VALUE CLOSE`` (the envelope's ``parameter_open`` / ``parameter_close``), required ones
always, the others optionally. VALUE by the property's schema:

* string (no enum), or no type at all: any text without the close tag (``</arg_value>``,
  ``</parameter>``: the first tag of ``parameter_close``) or the call's (``</tool_call>``: vLLM's GLM
  parser ends the call there), as the template writes a string raw;
  ``enum`` / ``const`` strings: one of them, raw;
* integer / number: JSON, in the form the history writes back (``1.5``, not ``1.50``);
* boolean ``true`` / ``false``, null ``null``; object / array (and any other typed schema): JSON for
  that sub-schema written like ``tojson`` (``json.dumps``), by xgrammar's JSON-schema grammar with
  the canonical strings and numbers of the JSON envelopes.

``additionalProperties`` is not offered: the model writes only the declared keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from server.constrain.arguments.xml import INT_RE, NUM_RE, _literal, _or, _types, _xgr
from server.families.tagged_arguments import close_tag


def _value(schema: dict[str, Any], json_grammar: Callable[[dict[str, Any]], Any]) -> Any | None:
    """The grammar of a non-string value, or None when the value is raw text (a string)."""
    xgr = _xgr()
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return _or([_literal(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)) for v in values])
    types = _types(schema)
    if not types and not any(k in schema for k in ("anyOf", "oneOf", "allOf", "$ref", "properties", "items")):
        return None
    if types == ["string"]:
        return None
    if types == ["integer"]:
        return xgr.Grammar.from_regex(INT_RE)
    if types == ["number"]:
        return xgr.Grammar.from_regex(NUM_RE)
    if types == ["boolean"]:
        return _or([_literal("true"), _literal("false")])
    if types == ["null"]:
        return _literal("null")
    return json_grammar(schema)


def _parameter(
    key: str,
    schema: Any,
    open_: str,
    close: str,
    ends: list[str],
    json_grammar: Callable[[dict[str, Any]], Any],
) -> Any:
    xgr = _xgr()
    begin = open_.replace("{key}", key)
    value = _value(schema if isinstance(schema, dict) else {}, json_grammar)
    if value is None:
        from xgrammar.structural_tag import AnyTextFormat, StructuralTag, TagFormat

        tag = TagFormat(begin=begin, content=AnyTextFormat(excludes=ends), end=close)
        return xgr.Grammar.from_structural_tag(StructuralTag(format=tag))
    return xgr.Grammar.concat(_literal(begin), value, _literal(close))


def tagged_grammar(
    schema: dict[str, Any],
    parameter: tuple[str, ...],
    suffix: str,
    json_grammar: Callable[[dict[str, Any]], Any],
) -> Any:
    """The arguments block of one call (possibly empty), for an object schema; ``suffix`` (call_end):
    a string value never holds its tag either (vLLM's GLM parser ends the call there); ``json_grammar``:
    the backend's JSON grammar of a sub-schema (canonical strings and numbers)."""
    if schema.get("type", "object") != "object":
        raise ValueError("tagged arguments need an object schema ('type': 'object')")
    open_, close = parameter
    ends = [close_tag(close)] + ([suffix.strip()] if suffix.strip() else [])
    required = set(schema.get("required") or [])
    props = schema.get("properties") or {}
    unknown = sorted(required - set(props))
    if unknown:
        raise ValueError(f"required properties {unknown} are not in 'properties'")
    empty = _literal("")
    pieces = []
    for key, sub in props.items():
        if any(c in key for c in '<>"\n'):
            raise ValueError(f"property name {key!r} cannot be written as a tagged argument")
        p = _parameter(key, sub, open_, close, ends, json_grammar)
        pieces.append(p if key in required else _xgr().Grammar.union(p, empty))
    if not pieces:
        return empty
    return pieces[0] if len(pieces) == 1 else _xgr().Grammar.concat(*pieces)
