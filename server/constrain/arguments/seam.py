"""The arguments phase's seam: a grammar engine constrains ``rest of name_close + ARGS + call_end``.

A small seam so the grammar engine can be swapped (config ``grammar_backend``, the registry in
``backends.py``):

* ``ArgumentsBackend.compile(tool, schema, frame)`` — compile once per (tool schema, envelope
  text), cached by the backend; a schema the engine cannot compile raises ``ConstraintError``
  (HTTP 400) naming the tool. ``frame`` (``CallFrame``) is the envelope's text around the
  arguments: ``prefix`` (rest of name_close), ``suffix`` (call_end), ``style`` (the envelope's
  ``arguments``: ``json``, ``xml_parameters``, Qwen3-Coder's parameters, grammar in
  ``xml.py``, or ``tagged``, GLM's, grammar in ``tagged.py`` from ``parameter``), ``call_id``
  (a regex standing for ``{call_id}`` in the suffix: an id the model writes, Mistral v3) and
  ``tails`` (one of these strings ends the grammar, after the suffix);
* ``ArgumentsBackend.matcher(compiled)`` — a fresh per-call ``ArgumentsMatcher``.

The compiled grammar starts with the rest of name_close (``', "arguments": '`` minus
the bytes a crossing token already wrote, fed with ``accept_bytes``) and ends with
call_end (``'}\\n</tool_call>'``), so the matcher is terminated exactly when the call
is closed. Arguments are JSON objects written like ``json.dumps`` (``", "``, ``": "``
separators) unless ``any_whitespace=True``, their strings in UTF-8 with only the escapes
``json.dumps(ensure_ascii=False)`` writes (``canonical_strings`` in ``xgrammar.py``: what every
family's history renders back, so the model's bytes and the next prompt's agree); a tool without
``parameters`` takes the empty object ``{}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from server.constrain.compile_cache import CompileCache

NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class CallFrame:
    """The envelope's text around one call's arguments (hashable: part of the compile caches' keys)."""

    prefix: str = ""  # the rest of name_close, before the arguments
    suffix: str = ""  # call_end, after them (may hold ``{call_id}``)
    style: str = "json"  # the envelope's ``arguments``: "json" | "xml_parameters"
    call_id: str | None = None  # a regex for ``{call_id}`` in the suffix (an id the model writes)
    tails: tuple[str, ...] = ()  # one of these ends the grammar, after the suffix
    parameter: tuple[str, ...] = ()  # style "tagged": (parameter_open with "{key}", parameter_close)


class ArgumentsMatcher(Protocol):
    def fill(self, bitmask: Any, index: int) -> None: ...

    def accept_token(self, token_id: int) -> bool: ...

    def accept_bytes(self, data: bytes) -> bool: ...

    def is_terminated(self) -> bool: ...


class ArgumentsBackend(Protocol):
    name: str

    def compile(self, tool: str, schema: dict[str, Any] | None, frame: CallFrame) -> Any: ...

    def matcher(self, compiled: Any) -> ArgumentsMatcher: ...


def tool_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The arguments schema of an OpenAI tool dict ({} parameters → no arguments)."""
    params: dict[str, Any] | None = (tool.get("function") or {}).get("parameters")
    return params if params else NO_PARAMETERS


def sorted_properties(schema: Any) -> Any:
    """The schema with every ``properties`` mapping in sorted key order (nested too).

    The grammar writes properties in the schema's order; an envelope with the opt-in
    ``key_order: sorted`` compiles this form instead (the shipped envelopes keep the schema's).
    """
    if isinstance(schema, list):
        return [sorted_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: sorted_properties(v) for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {
            k: sorted_properties(schema["properties"][k]) for k in sorted(schema["properties"])
        }
    return out


class CachedBackend:
    """What every arguments backend shares: ``compile`` looks its grammar up in an LRU keyed by the
    schema (property order matters) and the frame; ``_compile`` builds it."""

    cache: CompileCache

    def compile(self, tool: str, schema: dict[str, Any] | None, frame: CallFrame) -> Any:
        schema = schema or NO_PARAMETERS
        key = (json.dumps(schema), frame)  # property order matters
        return self.cache.get_or_make(
            key, lambda: self._compile(tool, schema, frame), f"the arguments grammar of tool {tool!r}"
        )

    def _compile(self, tool: str, schema: dict[str, Any], frame: CallFrame) -> Any:
        raise NotImplementedError
