"""An xgrammar grammar for Qwen3-Coder's XML parameters, generated from the tool's JSON schema.

The grammar allows exactly the text the chat template renders for arguments that fit the
schema (``server/families/xml_arguments.py``): properties in the schema's order (the
factory sorts them for ``key_order: sorted``), each ``<parameter=KEY>\\nVALUE\\n</parameter>\\n``,
required ones always, the others optionally. VALUE by the property's schema:

* string (no enum): any text not containing ``\\n</parameter>`` (a structural-tag ``tag``
  whose content is ``any_text``; excluding the end tag alone would let a value *end* with
  ``\\n</parameter>``, and ``V\\n</parameter>\\n`` would then read as a shorter value);
  ``enum`` / ``const`` strings: one of them, raw;
* integer / number: a JSON number in the form Python's ``str`` of it writes back (``1.5``, not ``1.50``);
* boolean: ``True`` / ``False`` and null: ``None`` (Jinja's ``|string`` of the value);
* object / array (and anything else typed): JSON for that sub-schema, written like
  ``json.dumps`` (the template's ``tojson``), by xgrammar's JSON-schema grammar;
* no type at all: any text, as a string.

Chosen over xgrammar's built-in ``qwen_xml`` style, which allows free whitespace around
values and JSON's ``true``, so the model could write text the history then renders
differently (a cache miss on every reply). ``additionalProperties`` is not offered: the
model writes only the declared keys.
"""

from __future__ import annotations

import json
from typing import Any

# written as the history writes the parsed value back (no "-0", no exponent, no trailing zero in a
# fraction: "1.5", never "1.50" or "1e5"; server/constrain/README.md "Numbers as the history writes them")
INT_RE = r"(0|-?[1-9][0-9]*)"
NUM_RE = r"(0(\.(0|[0-9]*[1-9]))?|-0\.(0|[0-9]*[1-9])|-?[1-9][0-9]*(\.(0|[0-9]*[1-9]))?)"


def _xgr() -> Any:  # the xgrammar module (untyped)
    import xgrammar as xgr

    return xgr


def _literal(text: str) -> Any:
    return _xgr().Grammar.from_ebnf(f"root ::= {json.dumps(text)}")


def _or(options: list[Any]) -> Any:
    return options[0] if len(options) == 1 else _xgr().Grammar.union(*options)


def _types(schema: dict[str, Any]) -> list[str]:
    t = schema.get("type")
    return list(t) if isinstance(t, list) else [t] if isinstance(t, str) else []


def _value(schema: dict[str, Any], any_whitespace: bool) -> Any | None:
    """The grammar of a non-string value, or None when the value is raw text (a string)."""
    xgr = _xgr()
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        if all(isinstance(v, str) for v in values):
            return _or([_literal(v) for v in values])
        return _or([_literal(v if isinstance(v, str) else _render(v)) for v in values])
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
        return _or([_literal("True"), _literal("False")])
    if types == ["null"]:
        return _literal("None")
    return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=any_whitespace)


def _render(value: Any) -> str:
    from server.families.xml_arguments import render_value

    return render_value(value)


def _parameter(key: str, schema: dict[str, Any], any_whitespace: bool) -> Any:
    xgr = _xgr()
    begin, end = f"<parameter={key}>\n", "\n</parameter>\n"
    value = _value(schema if isinstance(schema, dict) else {}, any_whitespace)
    if value is None:
        from xgrammar.structural_tag import AnyTextFormat, StructuralTag, TagFormat

        # no "\n</parameter>" inside: a value ending with it would make the text ambiguous
        tag = TagFormat(begin=begin, content=AnyTextFormat(excludes=[end.rstrip("\n")]), end=end)
        return xgr.Grammar.from_structural_tag(StructuralTag(format=tag))
    return xgr.Grammar.concat(_literal(begin), value, _literal(end))


def xml_parameters_grammar(schema: dict[str, Any], any_whitespace: bool = False) -> Any:
    """The parameters block of one call (possibly empty), for an object schema."""
    if schema.get("type", "object") != "object":
        raise ValueError("XML parameters need an object schema ('type': 'object')")
    required = set(schema.get("required") or [])
    props = schema.get("properties") or {}
    unknown = sorted(required - set(props))
    if unknown:
        raise ValueError(f"required properties {unknown} are not in 'properties'")
    empty = _literal("")
    pieces = []
    for key, sub in props.items():
        if any(c in key for c in "<>\n"):
            raise ValueError(f"property name {key!r} cannot be written as an XML parameter")
        p = _parameter(key, sub, any_whitespace)
        pieces.append(p if key in required else _xgr().Grammar.union(p, empty))
    if not pieces:
        return empty
    return pieces[0] if len(pieces) == 1 else _xgr().Grammar.concat(*pieces)
