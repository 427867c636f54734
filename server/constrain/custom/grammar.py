"""Custom tools: the model's free-text ``input`` constrained by the tool's grammar (Lark or regex).

A custom tool (``{"type": "custom", "custom": {"name", "format"}}``, normalised by
``server/custom_tools.py`` into a function tool with one string parameter ``input`` and
the format under ``CUSTOM_KEY``) is called inside the family's own envelope:

* JSON envelopes (``arguments: json``): ``{"input": "<input as a JSON string>"}``. The string is
  written with ``json.dumps(..., ensure_ascii=False)``'s escapes only (canonical: ``\\"``,
  ``\\\\``, ``\\n``/``\\t``/…, ``\\u00XX`` for other control characters, everything else raw),
  so ``json.loads`` gives back exactly the input and the history renders the call unchanged.
* XML envelopes (``xml_parameters``, Qwen3-Coder): ``<parameter=input>\\nINPUT\\n</parameter>\\n``,
  INPUT raw; it may not contain ``\\n</parameter>\\n`` (the parser's end of a value).

The grammar engine is llguidance (``LLMatcher``; its Lark dialect is the one OpenAI's custom
tools use). It runs over the *decoded* input bytes; this folder wraps it in a byte-level
transducer (``CustomMatcher``, ``matcher.py``): the envelope literal before the input, the input's encoding
(JSON escapes, or the XML end marker held back until it cannot be one), then the envelope
literal after it (one of several alternatives: ``tails``). The mask per step: llguidance's
mask over the raw tokens is exact for every token whose bytes encode themselves (no quote,
backslash or control byte; no newline in XML); the few others are checked one by one.

Everything here is built from the spec's JSON (the tool dict), so vLLM's processor builds
the same constraint in its engine core.
"""

from __future__ import annotations

import json
from typing import Any

from server.constrain.errors import ConstraintError
from server.tool_keys import CUSTOM_KEY


def custom_format(tool: dict[str, Any]) -> dict[str, Any] | None:
    """The custom format of a (normalised) tool dict, None for a function tool."""
    fmt = tool.get(CUSTOM_KEY)
    return fmt if isinstance(fmt, dict) else None


def prompt_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools as the prompt shows them: a custom tool's format stays out (its description states it)."""
    return [{k: v for k, v in t.items() if k != CUSTOM_KEY} if CUSTOM_KEY in t else t for t in tools]


NO_FORCING = '%llguidance {"no_forcing": true}\n'


def llg_grammar(fmt: dict[str, Any]) -> str:
    """The llguidance grammar of a normalised format (``{"type": "text"}`` or grammar + syntax).

    ``no_forcing``: llguidance otherwise allows only the canonical token over bytes the grammar
    forces (``***`` but not ``*``); the masks here judge tokens by their bytes (a JSON-escaped
    input is not the raw text llguidance sees), so every token that writes the bytes must pass.
    """
    import llguidance

    if fmt.get("type") == "text" or fmt.get("syntax") == "regex":
        regex = r"(?s:.*)" if fmt.get("type") == "text" else str(fmt.get("definition", ""))
        top = json.loads(llguidance.LLMatcher.grammar_from_regex(regex))
        for g in top.get("grammars", []):
            if isinstance(g.get("lark_grammar"), str):
                g["lark_grammar"] = NO_FORCING + g["lark_grammar"]
        return json.dumps(top)
    return NO_FORCING + str(fmt.get("definition", ""))


def check_format(fmt: dict[str, Any], where: str) -> None:
    """ConstraintError (400, ``param=where``) with the compiler's message when the grammar is bad."""
    import llguidance

    error = llguidance.LLMatcher.validate_grammar(llg_grammar(fmt))
    if error:
        raise ConstraintError(
            f"{where}: the {fmt.get('syntax', 'text')} grammar does not compile: {error.strip()}", param=where
        )
