"""An xgrammar grammar for Gemma 4's call arguments, generated from the tool's JSON schema.

The grammar allows exactly the text the chat template renders for arguments that fit the
schema (``server/families/gemma_arguments.py``): ``key:value`` pairs joined by ``,`` in
Jinja's ``dictsort`` order (case-insensitive), required keys always, the others optionally;
values by their schema:

* string: ``<|"|>`` + any text without ``<|"|>``, ``<tool_call|>`` or ``<turn|>`` + ``<|"|>`` (the
  delimiter is a special token: the envelope's ``grammar_tokens`` give it its text in the
  grammar's vocabulary; vLLM's parser ends a call at the other two wherever they are, so a string
  cannot hold them); ``enum`` / ``const``: one of them;
* integer / number: the form Python's ``str`` writes back (``1.5``, never ``1.50`` or ``1e5``);
* boolean: ``true`` / ``false``; null: ``None`` (Jinja's print of it);
* object with ``properties``: ``{`` + its pairs + ``}``; array: ``[`` + items joined by ``,`` + ``]``;
* ``anyOf`` / ``oneOf`` / a list of types: any of them; anything else (no type, ``$ref``, an object
  without properties): any Gemma value (free keys: their order cannot be held to dictsort).

Not enforced (the JSON-schema grammar of the other envelopes does enforce them): string
``pattern`` / ``format`` / lengths, numeric bounds, array lengths. The text of the EBNF
is built with one rule per object position (no blow-up with many optional keys).
"""

from __future__ import annotations

import json
from typing import Any

from server.families.gemma_arguments import QUOTE, render_value, sort_keys

# what a string may not hold: its delimiter, and the texts that end a call for vLLM's gemma4 parser
# (it reads them wherever they are: a call whose string held one would be cut there)
STRING_EXCLUDES = (QUOTE, "<tool_call|>", "<turn|>")

_RULES = r"""
g_str ::= "<|\"|>" g_c0 "<|\"|>"
g_int ::= "0" | "-"? [1-9] [0-9]*
g_num ::= "0" g_frac? | "-0" g_frac | "-"? [1-9] [0-9]* g_frac?
g_frac ::= "." ("0" | [0-9]* [1-9])
g_bool ::= "true" | "false"
g_null ::= "None"
g_any ::= g_str | g_num | g_bool | g_null | g_obj | g_arr
g_obj ::= "{" (g_pair ("," g_pair)*)? "}"
g_pair ::= g_key ":" g_any
g_key ::= [^:,{}\[\]<\"\n]+
g_arr ::= "[" (g_any ("," g_any)*)? "]"
"""
_BY_TYPE = {"string": "g_str", "integer": "g_int", "number": "g_num", "boolean": "g_bool", "null": "g_null"}
_KEY_FORBIDDEN = set(':,{}[]<"\n')


def _lit(text: str) -> str:
    return json.dumps(text)


class _Builder:
    def __init__(self) -> None:
        self.rules: list[str] = []
        self.count = 0

    def new(self, body: str) -> str:
        name = f"r{self.count}"
        self.count += 1
        self.rules.append(f"{name} ::= {body}")
        return name

    def value(self, schema: Any) -> str:
        if not isinstance(schema, dict):
            return "g_any"
        if "enum" in schema or "const" in schema:
            values = schema.get("enum", [schema.get("const")])
            return self.new(" | ".join(_lit(render_value(v)) for v in values) or '""')
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                return self.new(" | ".join(self.value(s) for s in schema[key]))
        t = schema.get("type")
        types = t if isinstance(t, list) else [t] if isinstance(t, str) else []
        if not types:
            return "g_any"
        return self.new(" | ".join(self._typed(x, schema) for x in types))

    def _typed(self, t: str, schema: dict[str, Any]) -> str:
        if t in _BY_TYPE:
            return _BY_TYPE[t]
        if t == "object":
            props = schema.get("properties")
            if not isinstance(props, dict) or not props:
                return "g_obj"
            return self.new(f'"{{" {self.pairs(schema)} "}}"')
        if t == "array":
            item = self.value(schema.get("items")) if isinstance(schema.get("items"), dict) else "g_any"
            return self.new(f'"[" ({item} ("," {item})*)? "]"')
        return "g_any"

    def pairs(self, schema: dict[str, Any]) -> str:
        """The rule of an object's pairs (no braces), keys in dictsort order."""
        props = schema.get("properties") or {}
        if not props and schema.get("additionalProperties", True) is not False:
            return self.new('(g_pair ("," g_pair)*)?')  # a free-form object: any pairs
        required = set(schema.get("required") or [])
        unknown = sorted(required - set(props))
        if unknown:
            raise ValueError(f"required properties {unknown} are not in 'properties'")
        keys = sort_keys(list(props))
        for key in keys:
            if not key or _KEY_FORBIDDEN & set(key) or key != key.strip():
                raise ValueError(f"property name {key!r} cannot be written as a Gemma 4 argument key")
        n = len(keys)
        # first[i]: the pairs from key i on, none written yet; rest[i]: after one was written
        first = [f"r{self.count}_u{i}" for i in range(n + 1)]
        rest = [f"r{self.count}_s{i}" for i in range(n + 1)]
        self.count += 1
        for i, key in enumerate(keys):
            pair = f"{_lit(key + ':')} {self.value(props[key])}"
            optional = key not in required
            self.rules.append(
                f"{first[i]} ::= {pair} {rest[i + 1]}" + (f" | {first[i + 1]}" if optional else "")
            )
            self.rules.append(
                f'{rest[i]} ::= "," {pair} {rest[i + 1]}' + (f" | {rest[i + 1]}" if optional else "")
            )
        self.rules.append(f'{first[n]} ::= ""')
        self.rules.append(f'{rest[n]} ::= ""')
        return first[0]


def _class_char(c: str) -> str:
    return "\\" + c if c in '\\]^-["' else c


def excluding_ebnf(excludes: tuple[str, ...], prefix: str = "g_c") -> list[str]:
    """Rules ``{prefix}0 …``: any text holding none of ``excludes`` (an Aho-Corasick automaton:
    one rule per proper prefix of an excluded text that the text read so far ends with)."""
    states = sorted({e[:i] for e in excludes for i in range(len(e))}, key=lambda t: (len(t), t))
    index = {state: i for i, state in enumerate(states)}
    alphabet = sorted({c for e in excludes for c in e})

    def step(state: str, c: str) -> str | None:
        text = state + c
        if any(text.endswith(e) for e in excludes):
            return None  # would complete an excluded text
        return next(text[i:] for i in range(len(text) + 1) if text[i:] in index)

    rules = []
    for state in states:
        options = ['""', f"[^{''.join(_class_char(c) for c in alphabet)}] {prefix}0"]
        for c in alphabet:
            nxt = step(state, c)
            if nxt is not None:
                options.append(f"{json.dumps(c)} {prefix}{index[nxt]}")
        rules.append(f"{prefix}{index[state]} ::= " + " | ".join(options))
    return rules


def gemma_arguments_ebnf(schema: dict[str, Any]) -> str:
    """The EBNF (root rule ``root``) of one call's pairs, between its braces, for an object schema."""
    if schema.get("type", "object") != "object":
        raise ValueError("Gemma 4 arguments need an object schema ('type': 'object')")
    b = _Builder()
    top = b.pairs(schema)
    return "\n".join([f"root ::= {top}", *b.rules, _RULES.strip(), *excluding_ebnf(STRING_EXCLUDES)])


def gemma_arguments_grammar(schema: dict[str, Any]) -> Any:
    """The xgrammar ``Grammar`` of one call's pairs."""
    import xgrammar as xgr

    return xgr.Grammar.from_ebnf(gemma_arguments_ebnf(schema))


__all__ = ["QUOTE", "gemma_arguments_ebnf", "gemma_arguments_grammar"]
