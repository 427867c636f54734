"""Parse the body of one tool call, as the envelope writes it, into a ``ParsedCall``.

* JSON objects (Hermes, Llama 3, Mistral v3): ``{"name": N, ARGS_KEY: {...}}`` where
  ARGS_KEY is read off the envelope's ``name_close`` (``"arguments"``, ``"parameters"``)
  and an id key off ``call_end`` (``"id": "{call_id}"``); a string holding JSON is
  accepted for the arguments. Any whitespace, any key order (unmasked output parses too).
* Mistral v13: ``NAME[ARGS]{...}``: the name, then a JSON object (v11: ``NAME[CALL_ID]ID[ARGS]{...}``,
  the id the model wrote).
* Tagged (GLM, MiniMax): ``NAME`` + name_close + ``OPEN(K) V CLOSE`` per argument.
* XML (Qwen3-Coder): ``<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n...</function>``,
  values typed by the tool's schema (``server/families/xml_arguments.py``).

Anything else is None: the caller keeps the text as content, nothing the model wrote
is dropped or altered to make it parse.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from server.families.conversation import dump_json
from server.families.envelope import Envelope
from server.families.gemma_arguments import parse_gemma_arguments
from server.families.xml_arguments import parse_xml_arguments

_KEY_RE = re.compile(r'"(\w+)"\s*:')
_FUNCTION_RE = re.compile(r"\s*<function=([^>\n]+)>\n?(.*?)</function>\s*", re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text
    id: str | None = None  # an id the model wrote (Mistral v3, v11), else None


class BodyParser:
    """Per (envelope, tools): turns one call's text into a ParsedCall."""

    def __init__(self, envelope: Envelope, tools: list[dict[str, Any]] | None = None) -> None:
        self.envelope = envelope
        keys = _KEY_RE.findall(envelope.name_close)
        self.args_key = keys[-1] if keys else "arguments"
        id_keys = _KEY_RE.findall(envelope.call_end.split("{call_id}")[0]) if envelope.call_id else []
        self.id_key = id_keys[-1] if id_keys else None
        self.schemas: dict[str, dict[str, Any]] = {}
        for tool in tools or []:
            fn = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                self.schemas[fn["name"]] = fn.get("parameters") or {}

    def json_object(self, obj: Any) -> ParsedCall | None:
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get(self.args_key, obj.get("arguments", obj.get("parameters", {})))
        args = _as_object(args)
        if args is None:
            return None
        call_id = obj.get(self.id_key) if self.id_key else None
        return ParsedCall(obj["name"], dump_json(args), call_id if isinstance(call_id, str) else None)

    def json_text(self, body: str) -> ParsedCall | None:
        try:
            return self.json_object(json.loads(body))
        except json.JSONDecodeError:
            return None

    def name_and_json(self, name: str, args_text: str, call_id: str | None = None) -> ParsedCall | None:
        try:
            args = _as_object(json.loads(args_text))
        except json.JSONDecodeError:
            return None
        return ParsedCall(name, dump_json(args), call_id) if args is not None and name else None

    def xml_function(self, body: str) -> ParsedCall | None:
        m = _FUNCTION_RE.fullmatch(body)
        if m is None:
            return None
        name = m.group(1)
        args = parse_xml_arguments(m.group(2), self.schemas.get(name))
        return ParsedCall(name, dump_json(args)) if args is not None else None

    def tagged_call(self, body: str) -> ParsedCall | None:
        """GLM / MiniMax: ``NAME`` + name_close + tagged arguments (server/families/tagged_arguments.py)."""
        from server.families.tagged_arguments import parse_tagged_arguments

        env = self.envelope
        lead = (env.call_start + env.name_open).split(env.call_tag, 1)[-1] if env.call_tag else env.name_open
        if not body.startswith(lead) or env.name_close not in body[len(lead) :]:
            return None
        name, _, rest = body[len(lead) :].partition(env.name_close)
        name = name.strip()
        args = parse_tagged_arguments(rest, env.parameter_open, env.parameter_close, self.schemas.get(name))
        return ParsedCall(name, dump_json(args)) if args is not None and name else None

    def gemma_function(self, body: str) -> ParsedCall | None:
        """Gemma 4: ``call:NAME{PAIRS`` (the close tag ``}<tool_call|>`` cut off)."""
        env = self.envelope
        if not body.startswith(env.name_open) or env.name_close not in body:
            return None
        name, _, pairs = body[len(env.name_open) :].partition(env.name_close)
        args = parse_gemma_arguments(pairs)
        return ParsedCall(name, dump_json(args)) if args is not None and name else None

    def tagged_body(self, body: str) -> ParsedCall | None:
        """The text between a call's tags (text-trigger envelopes; Gemma 4's token-trigger calls)."""
        if self.envelope.arguments == "xml_parameters":
            return self.xml_function(body)
        if self.envelope.arguments == "tagged":
            return self.tagged_call(body)
        if self.envelope.arguments == "gemma":
            return self.gemma_function(body)
        return self.json_text(body.strip())


def _as_object(args: Any) -> dict[str, Any] | None:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return args if isinstance(args, dict) else None
