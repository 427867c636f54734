"""Custom tools at the Chat Completions front door: normalised into function tools, answered as custom calls.

A leaf module (request shapes only: ``protocol.py`` runs ``normalize_request`` before validation);
whether a grammar compiles is checked in ``chat/tool_setup.py`` (``ToolSetup.check_tools``, a 400
naming ``tools[i].custom.format``).

A request's custom tool ``{"type": "custom", "custom": {"name": N, "description": D, "format": F}}``
(F: ``{"type": "text"}`` or absent; ``{"type": "grammar", "grammar": {"syntax": "lark" | "regex",
"definition": DEF}}``, or the Responses API's flat ``{"type": "grammar", "syntax", "definition"}``)
becomes, before validation, a function tool with one required string parameter ``input`` whose
description states the grammar, plus the format under ``CUSTOM_KEY`` (never rendered into the
prompt; it travels in the tool spec to the masks, ``server/constrain/custom/grammar.py``). So the
prompt, the history, the state machine, ``tool_choice`` and the parser treat it as a function
called with ``{"input": "..."}``; the masks write ``input`` under the grammar.

The same rewrite covers ``tool_choice`` (``{"type": "custom", "custom": {"name": N}}``),
``allowed_tools`` entries (``{"type": "custom", "name": N}`` or ``{"type": "custom", "custom":
{"name": N}}``) and history: an assistant message's ``{"type": "custom", "custom": {"name",
"input"}}`` call renders as the function call ``{"input": INPUT}`` (canonical JSON, exactly what
the masks had the model write). The reply turns a call of a custom tool back into
``{"type": "custom", "custom": {"name": N, "input": INPUT}}`` (``custom_call``).
"""

from __future__ import annotations

import json
from typing import Any

from server.errors import InvalidRequest
from server.session_key import canonical_json
from server.tool_keys import CUSTOM_KEY, INPUT

SYNTAXES = ("lark", "regex")


def normalize_request(data: Any) -> Any:
    """The raw chat request with custom tools, calls and choices in function form (400s on bad ones)."""
    if not isinstance(data, dict):
        return data
    tools = data.get("tools")
    if isinstance(tools, list) and any(isinstance(t, dict) and t.get("type") == "custom" for t in tools):
        data = {**data, "tools": [_tool(t, i) if _is_custom(t) else t for i, t in enumerate(tools)]}
    messages = data.get("messages")
    if isinstance(messages, list) and any(_has_custom_call(m) for m in messages):
        data = {**data, "messages": [_message(m, i) for i, m in enumerate(messages)]}
    choice = data.get("tool_choice")
    if isinstance(choice, dict):
        data = {**data, "tool_choice": _choice(choice)}
    return data


def _is_custom(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "custom"


def _format(tool: dict[str, Any], where: str) -> dict[str, Any]:
    fmt = tool.get("format")
    if fmt is None or fmt == {"type": "text"}:
        return {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
        raise InvalidRequest(
            f'{where} must be {{"type": "text"}} or {{"type": "grammar", "grammar": {{"syntax": '
            f'"lark" | "regex", "definition": ...}}}}, got {fmt!r}',
            param=where,
        )
    grammar = fmt.get("grammar", fmt)  # Chat Completions nests it; the Responses API does not
    syntax, definition = (
        (grammar.get("syntax"), grammar.get("definition")) if isinstance(grammar, dict) else (None, None)
    )
    if syntax not in SYNTAXES or not isinstance(definition, str) or not definition:
        raise InvalidRequest(
            f"{where}: a grammar format needs syntax 'lark' or 'regex' and a non-empty definition, "
            f"got syntax {syntax!r}",
            param=where,
        )
    return {"type": "grammar", "syntax": syntax, "definition": definition}  # compiled in prepare (400s)


def _tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    body = tool.get("custom")
    if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not body["name"]:
        raise InvalidRequest(
            f"tools[{i}] is a custom tool without a name: write "
            f'{{"type": "custom", "custom": {{"name": ...}}}}',
            param=f"tools[{i}].custom.name",
        )
    fmt = _format(body, f"tools[{i}].custom.format")
    return {
        "type": "function",
        "function": {
            "name": body["name"],
            "description": describe(body.get("description"), fmt),
            "parameters": {
                "type": "object",
                "properties": {INPUT: {"type": "string"}},
                "required": [INPUT],
                "additionalProperties": False,
            },
        },
        CUSTOM_KEY: fmt,
    }


def describe(description: Any, fmt: dict[str, Any]) -> str:
    """The description the prompt shows: the client's, then what ``input`` must be."""
    head = f"{description}\n\n" if isinstance(description, str) and description else ""
    if fmt["type"] == "text":
        return head + f"Custom tool: put the tool's whole input, as free text, in the `{INPUT}` argument."
    return head + (
        f"Custom tool: put the tool's whole input, as free text (not JSON), in the `{INPUT}` argument. "
        f"The input must match this {fmt['syntax']} grammar exactly:\n{fmt['definition']}"
    )


def _has_custom_call(message: Any) -> bool:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return isinstance(calls, list) and any(_is_custom(c) for c in calls)


def _message(message: Any, i: int) -> Any:
    if not _has_custom_call(message):
        return message
    calls = []
    for j, call in enumerate(message["tool_calls"]):
        if not _is_custom(call):
            calls.append(call)
            continue
        body = call.get("custom")
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("name"), str)
            or not isinstance(body.get("input"), str)
        ):
            raise InvalidRequest(
                f"messages[{i}].tool_calls[{j}] is a custom call without a name and a string input: "
                f'write {{"type": "custom", "custom": {{"name": ..., "input": ...}}}}',
                param=f"messages[{i}].tool_calls[{j}].custom",
            )
        fn = {"name": body["name"], "arguments": canonical_json({INPUT: body["input"]})}
        calls.append(
            {k: v for k, v in call.items() if k not in ("type", "custom")}
            | {"type": "function", "function": fn}
        )
    return {**message, "tool_calls": calls}


def _named(entry: dict[str, Any]) -> dict[str, Any]:
    """A custom entry (``{"type": "custom", "custom": {"name": N}}`` or ``{"type": "custom", "name": N}``)
    as a function one."""
    if not _is_custom(entry):
        return entry
    inner = entry.get("custom")
    body: dict[str, Any] = inner if isinstance(inner, dict) else entry
    return {"type": "function", "function": {"name": body.get("name")}}


def _choice(choice: dict[str, Any]) -> dict[str, Any]:
    if _is_custom(choice):
        return _named(choice)
    allowed = choice.get("allowed_tools")
    if (
        choice.get("type") == "allowed_tools"
        and isinstance(allowed, dict)
        and isinstance(allowed.get("tools"), list)
    ):
        tools = [_named(e) if isinstance(e, dict) else e for e in allowed["tools"]]
        return {**choice, "allowed_tools": {**allowed, "tools": tools}}
    return choice


def custom_names(tools: list[dict[str, Any]] | None) -> frozenset[str]:
    """The names of the (normalised) custom tools."""
    return frozenset(
        str((t.get("function") or {}).get("name")) for t in tools or [] if isinstance(t.get(CUSTOM_KEY), dict)
    )


def custom_input(arguments: str) -> str | None:
    """The ``input`` of a custom call's arguments as written (None when they are not ``{"input": str}``)."""
    try:
        value = json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return None
    if isinstance(value, dict) and set(value) == {INPUT} and isinstance(value[INPUT], str):
        return str(value[INPUT])
    return None
