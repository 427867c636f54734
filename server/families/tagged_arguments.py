"""Tagged arguments (``arguments: tagged``): one ``OPEN(KEY) VALUE CLOSE`` per argument, as data.

GLM-4.5 / 4.6 write ``<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n``, GLM-4.7 / 5
``<arg_key>K</arg_key><arg_value>V</arg_value>``, MiniMax M2 ``<parameter name="K">V</parameter>\\n``:
the envelope's ``parameter_open`` (with ``{key}``) and ``parameter_close`` say which. The value is
written as those chat templates write it: a string raw, anything else ``tojson(ensure_ascii=False)``
(``json.dumps`` with ``", "`` / ``": "``: ``3``, ``1.5``, ``true``, ``null``, ``{"a": 1}``).

Parsing reads the same form back; a value is typed by the tool's schema as vLLM's parsers do
(``glm45`` / ``glm47`` / ``minimax_m2``): a string property keeps the raw text, another type
is read as JSON (a value that is not JSON stays a string); without a schema type the value is a
string. Nothing else is accepted: text that is not this form is not a call.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from server.families.xml_arguments import schema_types


def render_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render_tagged_arguments(arguments: str | dict[str, Any], open_: str, close: str) -> str:
    """The arguments block (JSON text or a dict), in the arguments' key order."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    if not isinstance(args, dict):
        raise ValueError(f"tool-call arguments must be a JSON object, got {type(args).__name__}")
    return "".join(open_.replace("{key}", k) + render_value(v) + close for k, v in args.items())


def close_tag(close: str) -> str:
    """The tag that ends a value ("</arg_value>" of "</arg_value>\\n"): a string value never holds it."""
    end = close.find(">")
    return close[: end + 1] if end >= 0 else close


@cache
def _pattern(open_: str, close: str) -> re.Pattern[str]:
    head, _, tail = open_.partition("{key}")
    return re.compile(
        rf"\s*{re.escape(head)}(.*?){re.escape(tail)}(.*?){re.escape(close_tag(close))}", re.DOTALL
    )


def type_value(raw: str, schema: Any) -> Any:
    """The JSON value of a raw argument text, typed by its property schema."""
    types = schema_types(schema)
    if not types or types == {"string"}:
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_tagged_arguments(
    body: str, open_: str, close: str, schema: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The arguments dict of a block of tagged arguments, or None when it holds other text."""
    props = (schema or {}).get("properties") or {}
    rest = close[len(close_tag(close)) :]
    out: dict[str, Any] = {}
    pos = 0
    pattern = _pattern(open_, close)
    while (m := pattern.match(body, pos)) is not None:
        key = m.group(1).strip()
        out[key] = type_value(m.group(2), props.get(key))
        pos = m.end() + (len(rest) if body.startswith(rest, m.end()) else 0)
    return out if not body[pos:].strip() else None
