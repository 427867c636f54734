"""``tool_choice`` (or the state machine) → a ``ToolPlan``: mode, allowed tools, prefill.

Forms accepted (the OpenAI ones plus one extension):

* ``"none"`` | ``"auto"`` | ``"required"``
* ``{"type": "function", "function": {"name": X}}`` — exactly tool X
* ``{"type": "allowed_tools", "allowed_tools": {"mode": "auto"|"required", "tools": [E, ...]}}``
  where each entry E is ``{"type": "function", "function": {"name": X}}`` or the extension
  ``{"type": "function", "function": {"name_prefix": "browser_"}}`` (every tool with that prefix).
* ``None`` (not sent): the state machine decides; without one, ``"auto"`` over all tools.

An explicit ``tool_choice`` always wins over the state machine. No tools at all → mode
"none" (asking for a call then is a 400). An allowed set that ends up empty → "none".

Prefill (appended after the assistant header, after the cached prompt, so switching
modes never lowers ``cached_tokens``): auto/none → ``""``; required, a subset or a named
tool → ``opening + P`` (``calls_open + call_start + name_open``) where P is the longest common prefix of the
allowed names *cut back to a clean token boundary*. Prefilling a partial word forces
an unnatural tokenization (``browser_cl`` + ``ick`` instead of ``browser_`` + ``click``:
the model never saw that split). Byte-level BPE tokenizers never merge across a
pre-tokenizer boundary, and with the regexes in use (GPT-2 / SmolLM2, Llama 3, Qwen)
a change of character class (letter / digit / space / other) is one, except other →
letter (Llama 3 and Qwen glue one punctuation character to the word after it:
``_open``). So P is cut at the last position where, in *every* allowed name, the
class changes and is not other → letter (after a full name comes name_close's ``"``).
Examples: {browser_click, browser_close} → ``browser``; a single name ``browser_open``
→ the whole name (the model then writes ``",``); ``foo_`` alone → ``foo``.
The trie forces whatever of the name is left, with the model's own tokenization.
"""

from __future__ import annotations

import os
import unicodedata
from typing import Any

from server.chat.state_machine import StateMachine
from server.constrain.plan import Mode, ToolPlan, tool_names
from server.engines.base import constraint_errors_as_400
from server.errors import InvalidRequest
from server.families.envelope import Envelope
from server.protocol_tool_choice import (
    AllowedToolRef,
    AllowedToolsChoice,
    NamedToolChoice,
    ToolChoice,
    parse_tool_choice,
)


def _unknown(what: str, value: str, names: tuple[str, ...]) -> InvalidRequest:
    return InvalidRequest(
        f"tool_choice names {what} {value!r}, which matches no tool in tools; the tools are: {list(names)}",
        param="tool_choice",
    )


def _entry_names(entry: AllowedToolRef, names: tuple[str, ...]) -> set[str]:
    if entry.name is not None:
        if entry.name not in names:
            raise _unknown("the tool", entry.name, names)
        return {entry.name}
    prefix = entry.name_prefix or ""
    found = {n for n in names if n.startswith(prefix)}
    if not found:
        raise _unknown("the prefix", prefix, names)
    return found


def _explicit(choice: ToolChoice, names: tuple[str, ...]) -> tuple[Mode, tuple[str, ...]]:
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise _unknown("the tool", choice.function.name, names)
        return "required", (choice.function.name,)
    if isinstance(choice, AllowedToolsChoice):
        spec = choice.allowed_tools
        chosen: set[str] = set()
        for entry in spec.tools:
            chosen |= _entry_names(entry, names)
        if not chosen and spec.mode == "required":
            raise InvalidRequest("allowed_tools.tools is empty but mode is required", param="tool_choice")
        return spec.mode, tuple(n for n in names if n in chosen)
    if choice == "required" and not names:
        raise InvalidRequest('tool_choice "required" needs at least one tool in tools', param="tool_choice")
    return choice, names if choice != "none" else ()


def _char_class(c: str) -> int:
    if c.isspace():
        return 0
    cat = unicodedata.category(c)
    return 1 if cat.startswith("L") else 2 if cat.startswith("N") else 3


def _boundary(left: str, right: str) -> bool:
    a, b = _char_class(left), _char_class(right)
    return a != b and not (a == 3 and b == 1)


def clean_name_prefix(allowed: tuple[str, ...] | list[str], name_close: str) -> str:
    """The allowed names' common prefix, cut back to a token boundary in every name (see module doc)."""
    if not allowed:
        return ""
    lcp = os.path.commonprefix(list(allowed))
    after = name_close[:1] or " "
    for k in range(len(lcp), 0, -1):
        if all(_boundary(n[k - 1], n[k] if k < len(n) else after) for n in allowed):
            return lcp[:k]
    return ""


@constraint_errors_as_400()  # tool_names: a bad name is the client's 400
def plan_tools(
    tools: list[dict[str, Any]] | None,
    tool_choice: ToolChoice | str | dict[str, Any] | None,
    messages: list[dict[str, Any]],
    parallel_tool_calls: bool,
    machine: StateMachine | None,
    envelope: Envelope | None,
) -> ToolPlan:
    """``envelope`` None: no call format is known (``model_family: template``, no envelope): nothing
    can force or forbid a call, so only the modes that need neither are served (``unmasked``)."""
    names = tool_names(tools)
    state = None
    mode: Mode
    allowed: tuple[str, ...]
    choice = parse_tool_choice(tool_choice)  # already typed when it came through the API
    if envelope is None:
        return unmasked(choice, tool_choice, names, parallel_tool_calls)
    if choice is not None:
        if not names and choice not in ("none", "auto"):
            raise InvalidRequest(
                f"tool_choice {tool_choice!r} needs tools, but tools is empty", param="tool_choice"
            )
        mode, allowed = _explicit(choice, names)
    elif machine is not None and names:
        state, mode, allowed = machine.decide(messages, names)
        allowed = tuple(n for n in names if n in set(allowed))
    else:
        mode, allowed = "auto", names
    if not allowed:
        mode = "none"
    prefill = ""
    if mode == "required":
        prefill = envelope.opening + clean_name_prefix(allowed, envelope.name_close)
    # Kimi's call ids count every call of the conversation (functions.NAME:IDX): the masks go on from there
    first = sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
    allowed = allowed if mode != "none" else ()
    first = first if envelope.call_id_counts else 0
    return ToolPlan(mode, allowed, bool(parallel_tool_calls), prefill, state, first_call_index=first)


def unmasked(choice: ToolChoice | None, sent: object, names: tuple[str, ...], parallel: bool) -> ToolPlan:
    """The plan without an envelope: "auto" (or the client's "none"); the state machine does not
    apply (its choice is enforced by the masks) and a forced call is a 400 saying how to get one."""
    mode, allowed = _explicit(choice, names) if choice is not None else ("auto", names)
    if mode == "required":
        raise InvalidRequest(
            f"tool_choice {sent!r} forces a call, and this server has no tool-call envelope for its model "
            "(model_family: template, a model no family file covers): calls are neither masked nor "
            'parsed. Send tool_choice "auto" or "none", or ask the operator to set envelope: NAME in '
            "the config when one of grammars/envelopes/ matches the model's call format",
            param="tool_choice",
        )
    if not allowed:
        mode = "none"
    return ToolPlan(mode, allowed if mode != "none" else (), bool(parallel), "")
