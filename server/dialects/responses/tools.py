"""Responses tools and tool_choice → their Chat Completions forms, and call names back.

- ``function`` tools are flat in Responses (``{"type": "function", "name", "parameters", …}``);
  in chat they nest under ``function``. Every key is kept, in the client's order.
- ``namespace`` tools (``{"type": "namespace", "name": NS, "tools": [...]}``, Codex's MCP
  servers) are flattened: each inner tool becomes one chat tool named ``flat_name(NS, name)``
  — ``NS + name`` when NS already ends with a separator (``_ - . :``, as Codex's
  ``mcp__server__`` does), else ``NS + "__" + name``. The model sees the flat name; a call the
  model makes is mapped back through ``ToolNames`` (built from this request's tools, so the
  mapping is exact, never a string split) to a ``function_call`` item with ``name`` = the inner
  name and ``namespace`` = NS, as the OpenAI Responses API represents a namespaced call. A
  replayed ``function_call`` item with a ``namespace`` is flattened the same way. A flat name
  that collides with another tool's name is a 400.
- ``custom`` tools (free-form input, optionally a Lark or regex grammar) → the chat custom tool
  shape ``{"type": "custom", "custom": {"name", "description", "format": {"type": "grammar",
  "grammar": {"syntax", "definition"}}}}`` (or ``{"type": "text"}``).
- Hosted tools the server cannot run (``web_search``, ``file_search``, ``code_interpreter``,
  ``computer_use_preview``, ``image_generation``, ``local_shell``, ``mcp``, … any other type) are
  dropped, listed in the response's ``agentserve.dropped_tools`` (types cut to 64 characters) and
  logged in one line per request (under the log budget, ``server/log_budget.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from server.errors import InvalidRequest
from server.log_budget import REQUEST_LOG, cut, tally

log = logging.getLogger(__name__)

SEPARATORS = ("_", "-", ".", ":")
JOIN = "__"


def flat_name(namespace: str, name: str) -> str:
    """The chat tool name of ``name`` inside ``namespace`` (see the module docstring)."""
    return namespace + name if namespace.endswith(SEPARATORS) else namespace + JOIN + name


@dataclass
class ToolNames:
    """Flat chat name → (namespace, inner name) for the namespaced tools of one request."""

    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    custom: set[str] = field(default_factory=set)
    dropped: list[dict[str, Any]] = field(default_factory=list)

    def item_name(self, chat_name: str) -> tuple[str, str | None]:
        """(name, namespace or None) for a function_call item from a chat call's name."""
        if chat_name in self.namespaced:
            ns, inner = self.namespaced[chat_name]
            return inner, ns
        return chat_name, None


def _need_str(tool: dict[str, Any], key: str, where: str) -> str:
    value = tool.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(
            f"{where} has no {key!r}: a {tool.get('type')} tool needs a non-empty string {key!r}", param=where
        )
    return value


def _function(tool: dict[str, Any], name: str) -> dict[str, Any]:
    fn = {k: v for k, v in tool.items() if k != "type"}
    fn["name"] = name
    return {"type": "function", "function": fn}


def _custom_format(fmt: Any, where: str) -> dict[str, Any]:
    if fmt is None or fmt == {"type": "text"}:
        return {"type": "text"}
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        syntax, definition = fmt.get("syntax"), fmt.get("definition")
        if syntax in ("lark", "regex") and isinstance(definition, str) and definition:
            return {"type": "grammar", "grammar": {"syntax": syntax, "definition": definition}}
    raise InvalidRequest(
        f"{where}.format {fmt!r} is malformed: use {{'type': 'text'}} or "
        "{'type': 'grammar', 'syntax': 'lark' | 'regex', 'definition': GRAMMAR}",
        param=f"{where}.format",
    )


def _custom(tool: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for k, v in tool.items():
        if k == "type":
            continue
        body[k] = _custom_format(v, where) if k == "format" else v
    body["name"] = name
    return {"type": "custom", "custom": body}


def convert_tools(tools: Any) -> tuple[list[dict[str, Any]], ToolNames]:
    """Responses ``tools`` → chat ``tools`` and the name map (400 on malformed tools)."""
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be a list of tool objects", param="tools")
    out: list[dict[str, Any]] = []
    names = ToolNames()
    hosted: list[str] = []  # the dropped tools' types as sent (logged in one line, cut)
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise InvalidRequest(
                f"{where} is not a tool object: send {{'type': 'function', 'name': ..., 'parameters': ...}}",
                param=where,
            )
        kind = tool["type"]
        if kind == "function":
            out.append(_function(tool, _need_str(tool, "name", where)))
        elif kind == "custom":
            name = _need_str(tool, "name", where)
            names.custom.add(name)
            out.append(_custom(tool, name, where))
        elif kind == "namespace":
            out += _namespace(tool, where, names)
        else:
            names.dropped.append({"index": i, "type": cut(kind)})  # echoed in the response: cut
            hosted.append(kind)
    if names.dropped:  # one line per request, under the log budget (server/log_budget.py)
        kinds = tally(hosted)
        REQUEST_LOG.log(
            log,
            logging.WARNING,
            "responses: dropped %d hosted tool(s) this server cannot run: %s",
            len(names.dropped),
            kinds,
        )
    seen: set[str] = set()
    for t in out:
        name = t.get("function", t.get("custom", {})).get("name")
        if name in seen:
            raise InvalidRequest(
                f"tool name {name!r} appears twice after flattening namespaces: rename one tool",
                param="tools",
            )
        seen.add(name)
    return out, names


def _namespace(tool: dict[str, Any], where: str, names: ToolNames) -> list[dict[str, Any]]:
    ns = _need_str(tool, "name", where)
    inner = tool.get("tools")
    if not isinstance(inner, list):
        raise InvalidRequest(
            f"{where}.tools must be a list of function or custom tools", param=f"{where}.tools"
        )
    out = []
    for j, sub in enumerate(inner):
        sub_where = f"{where}.tools[{j}]"
        kind = sub.get("type") if isinstance(sub, dict) else None
        if kind not in ("function", "custom"):
            raise InvalidRequest(
                f"{sub_where} has type {kind!r}: a namespace holds only 'function' and 'custom' tools",
                param=sub_where,
            )
        assert isinstance(sub, dict)
        name = _need_str(sub, "name", sub_where)
        flat = flat_name(ns, name)
        names.namespaced[flat] = (ns, name)
        if kind == "custom":
            names.custom.add(flat)
            out.append(_custom(sub, flat, sub_where))
        else:
            out.append(_function(sub, flat))
    return out


def _entry(ref: Any, names: ToolNames) -> dict[str, Any] | None:
    """One ``allowed_tools.tools`` entry in chat form; None for a dropped hosted tool."""
    if not isinstance(ref, dict):
        raise InvalidRequest(f"malformed entry in tool_choice.tools: {ref!r}", param="tool_choice")
    kind = ref.get("type")
    if kind == "function":
        if isinstance(ref.get("name"), str):
            return {"type": "function", "function": {"name": _chat_name(ref, names)}}
        fn = ref.get("function")
        if isinstance(fn, dict):  # the chat spelling (and our name_prefix extension) pass through
            return {"type": "function", "function": fn}
    elif kind == "custom" and isinstance(ref.get("name"), str):
        return {"type": "custom", "custom": {"name": _chat_name(ref, names)}}
    elif isinstance(kind, str) and kind not in ("function", "custom"):
        return None
    raise InvalidRequest(
        f"malformed entry in tool_choice.tools: {ref!r}: use {{'type': 'function', 'name': NAME}}",
        param="tool_choice",
    )


def _chat_name(ref: dict[str, Any], names: ToolNames) -> str:
    name: str = ref["name"]
    ns = ref.get("namespace")
    return flat_name(ns, name) if isinstance(ns, str) and ns else name


def convert_tool_choice(choice: Any, names: ToolNames) -> Any:
    """Responses ``tool_choice`` → the chat form (which ``parse_tool_choice`` then checks)."""
    if choice is None or isinstance(choice, str):
        return choice
    if not isinstance(choice, dict):
        raise InvalidRequest(f"malformed tool_choice {choice!r}", param="tool_choice")
    kind = choice.get("type")
    if kind == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": _chat_name(choice, names)}}
    if kind == "custom" and isinstance(choice.get("name"), str):
        return {"type": "custom", "custom": {"name": _chat_name(choice, names)}}
    if kind == "allowed_tools":
        raw = choice.get("tools")
        if not isinstance(raw, list):
            raise InvalidRequest("tool_choice.tools must be a list of tool references", param="tool_choice")
        entries = [e for e in (_entry(r, names) for r in raw) if e is not None]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode"), "tools": entries}}
    if kind in ("function", "custom"):
        return choice  # the chat spelling ({"function": {...}}) passes through to the chat checks
    raise InvalidRequest(
        f"tool_choice {choice!r} forces a tool this server cannot run (hosted tools are dropped): "
        "use 'auto', 'none', 'required', {'type': 'function', 'name': NAME}, "
        "{'type': 'custom', 'name': NAME} "
        "or {'type': 'allowed_tools', 'mode': 'auto' | 'required', 'tools': [...]}",
        param="tool_choice",
    )
