"""Data-driven prompt rendering: a family file's Jinja snippets -> text + labelled segments.

One renderer for every family: it normalises the conversation as the family's layout
says (merge consecutive roles, move the system text, group tool results), checks the
family's rules (a 400 that says what and how to fix), and renders each turn with the
family's snippet. Snippets mark labelled spans with ``seg(label, text)``; the markers
become ``Segment``s (the cache report names the part of the prompt that changed).

Determinism: tool definitions and call arguments are canonical JSON (sorted keys, fixed
separators) before any snippet sees them; the date a family prints is pinned (family
data or config), never read from the clock.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from server.errors import InvalidRequest
from server.families.rendered import RenderedPrompt, Segment
from server.families.spec import Family, load_family
from server.session_key import canonical_json

_OPEN, _MID, _CLOSE = "\ufdd0", "\ufdd1", "\ufdd2"  # Unicode noncharacters: never valid text


def _json(value: Any, indent: int | None = None, ascii: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ascii, indent=indent, separators=None if indent else (", ", ": "))


def _pyval(value: Any, json: bool = True) -> str:
    """A value as Jinja's ``| string`` writes it (True, 3, 1.5), JSON for objects and arrays."""
    if json and isinstance(value, (dict, list)):
        return _json(value)
    return str(value)


def _seg(label: str, text: Any) -> str:
    text = str(text)
    return f"{_OPEN}{label}{_MID}{text}{_CLOSE}" if text else ""


@cache
def _env() -> jinja2.Environment:
    env = ImmutableSandboxedEnvironment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )
    env.filters["json"] = _json
    env.filters["pyval"] = _pyval
    env.globals["seg"] = _seg
    return env


@cache
def _template(source: str) -> jinja2.Template:
    return _env().from_string(source)


def canonical_value(value: Any) -> Any:
    """``value`` with every mapping's keys sorted (dicts keep insertion order)."""
    return json.loads(canonical_json(value))


def canonical_arguments(arguments: str) -> str:
    """Tool-call arguments re-serialized canonically (sorted keys) when they are JSON."""
    try:
        return canonical_json(json.loads(arguments))
    except (json.JSONDecodeError, TypeError):
        return arguments


@dataclass
class _Call:
    index: int
    id: str | None
    name: str
    arguments: str  # as the family writes it (canonical JSON text, or the raw text)
    args: Any  # parsed and key-sorted, or the raw text when not JSON


@dataclass
class _Msg:
    index: int
    role: str  # system | user | assistant | tool
    content: str
    calls: list[_Call] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None  # for tool results: the called function's name

    @property
    def label(self) -> str:
        if self.role == "system" and self.index == 0:
            return "system message"
        if self.index < 0:
            return "default system message" if self.role == "system" else f"added {self.role} message"
        return f"message {self.index} ({self.role})"


def _text(msg: Any, index: int) -> str:
    content = msg.content
    if isinstance(content, list):
        for part in content:
            if part.type != "text":
                raise InvalidRequest(
                    f"messages[{index}].content has a part of type {part.type!r}: only 'text' parts are "
                    f"supported by this model",
                    param=f"messages[{index}].content",
                )
    text = msg.text()
    if any(c in text for c in (_OPEN, _MID, _CLOSE)):
        raise InvalidRequest(
            f"messages[{index}].content contains a Unicode noncharacter (U+FDD0..U+FDD2): remove it",
            param=f"messages[{index}].content",
        )
    return text


class FamilyRenderer:
    """Renders conversations for one family (``render``), with the family's pinned date."""

    def __init__(self, family: Family | str, date: str | None = None) -> None:
        self.family = load_family(family) if isinstance(family, str) else family
        self.date = date or self.family.date or ""

    # -- input -> normalised messages --------------------------------------------------
    def _call(self, call: Any, index: int, where: str) -> _Call:
        raw = call.function.arguments
        try:
            parsed = canonical_value(json.loads(raw)) if raw.strip() else {}
            is_json = True
        except json.JSONDecodeError:
            parsed, is_json = raw, False
        rules, layout = self.family.rules, self.family.layout
        if rules.arguments_must_be_object and not isinstance(parsed, dict):
            raise InvalidRequest(
                f"{where}.function.arguments is not a JSON object: the {self.family.name} family writes "
                f"call arguments as a JSON object; send the arguments as a JSON object string",
                param=f"{where}.function.arguments",
            )
        if not is_json:
            text = raw
        elif layout.arguments_json == "ascii":
            text = json.dumps(parsed)
        else:
            text = canonical_json(parsed)
        return _Call(index, call.id, call.function.name, text, parsed)

    def _messages(self, messages: Sequence[Any]) -> list[_Msg]:
        out = []
        for i, m in enumerate(messages):
            role = "system" if m.role == "developer" else m.role
            calls = [
                self._call(c, j, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m.tool_calls or [])
            ]
            out.append(
                _Msg(i, role, _text(m, i), calls if role == "assistant" else [], m.tool_call_id, m.name)
            )
        return out

    def _check(self, msgs: list[_Msg]) -> None:
        """The family's rules: what its format cannot express is a 400 that says how to fix it."""
        rules, name = self.family.rules, self.family.name
        open_ids: dict[str, str] = {}  # call id -> function name, for the calls of the latest turn
        open_count = 0
        for m in msgs:
            if m.role == "assistant":
                if m.calls and m.content.strip() and not rules.calls_with_content:
                    raise InvalidRequest(
                        f"messages[{m.index}] has both text content and tool_calls: the {name} family "
                        f"cannot write both in one assistant turn; send the text as its own assistant "
                        f"message before the one with the tool calls",
                        param=f"messages[{m.index}]",
                    )
                open_ids = {}
                open_count = len(m.calls)
                for c in m.calls:
                    if rules.call_id_pattern is not None:
                        if c.id is None or not re.fullmatch(rules.call_id_pattern, c.id):
                            raise InvalidRequest(
                                f"messages[{m.index}].tool_calls[{c.index}].id is {c.id!r}: the {name} "
                                f"family needs call ids matching {rules.call_id_pattern} "
                                f"{rules.call_id_hint}".rstrip(),
                                param=f"messages[{m.index}].tool_calls[{c.index}].id",
                            )
                    if c.id:
                        open_ids[c.id] = c.name
            elif m.role == "tool":
                where = f"messages[{m.index}]"
                if rules.tool_result_needs_id and not m.tool_call_id:
                    raise InvalidRequest(
                        f"{where} (role 'tool') has no tool_call_id: the {name} family pairs every result "
                        f"with its call; set tool_call_id to the id of the call it answers",
                        param=f"{where}.tool_call_id",
                    )
                if rules.tool_result_needs_call:
                    if open_count == 0:
                        raise InvalidRequest(
                            f"{where} is a tool result with no preceding assistant tool call: the {name} "
                            f"family pairs every result with a call of the assistant turn before it; add "
                            f"that assistant message with its tool_calls, or send the result as a user "
                            f"message",
                            param=where,
                        )
                    if rules.tool_result_needs_id and m.tool_call_id not in open_ids:
                        raise InvalidRequest(
                            f"{where}.tool_call_id {m.tool_call_id!r} answers no call of the assistant turn "
                            f"before it (its call ids: {sorted(open_ids)}): use one of those ids",
                            param=f"{where}.tool_call_id",
                        )
                    open_count -= 1
                if m.tool_call_id in open_ids:
                    m.name = open_ids[m.tool_call_id]
            else:
                open_ids, open_count = {}, 0

    def _normalise(self, msgs: list[_Msg], has_tools: bool) -> tuple[list[_Msg], str]:
        layout = self.family.layout
        system_text = ""
        if layout.system_placement == "last_user":
            systems = [m.content for m in msgs if m.role == "system" and m.content]
            system_text = layout.merge_separator.join(systems)
            msgs = [m for m in msgs if m.role != "system"]
        merged: list[_Msg] = []
        for m in msgs:
            prev = merged[-1] if merged else None
            if prev is not None and prev.role == m.role and m.role in layout.merge_consecutive:
                parts = [p for p in (prev.content, m.content) if p]
                merged[-1] = _Msg(
                    prev.index,
                    prev.role,
                    layout.merge_separator.join(parts),
                    prev.calls + m.calls,
                    prev.tool_call_id,
                    prev.name,
                )
            else:
                merged.append(m)
        if layout.sort_tool_results_by_call:
            merged = _sort_results(merged)
        if layout.empty_user_first and (not merged or merged[0].role != "user"):
            merged.insert(0, _Msg(-1, "user", ""))
        if layout.always_system_turn and not any(m.role == "system" for m in merged[:1]):
            merged.insert(0, _Msg(-1, "system", self.family.default_system))
        elif (
            layout.system_placement == "turn"
            and self.family.default_system
            and (has_tools or not layout.default_system_only_with_tools)
            and (not merged or merged[0].role != "system")
        ):
            merged.insert(0, _Msg(-1, "system", self.family.default_system))
        return merged, system_text

    # -- rendering -------------------------------------------------------------------
    def _tools(self, tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for tool in tools:
            fn = canonical_value(tool.get("function", {}))
            fn.pop("strict", None)
            out.append(
                {
                    "name": fn.get("name", ""),
                    "description": fn.get("description"),
                    "parameters": fn.get("parameters"),
                    "function": fn,
                    "json": canonical_json(tool),
                }
            )
        return out

    def render(
        self,
        messages: Sequence[Any],
        tools: Sequence[dict[str, Any]] | None,
        add_generation_prompt: bool = True,
    ) -> RenderedPrompt:
        fam, layout = self.family, self.family.layout
        msgs = self._messages(messages)
        self._check(msgs)
        turns, system_text = self._normalise(msgs, bool(tools))
        tool_ctx = self._tools(list(tools or []))
        base = {
            "date": self.date,
            "tools": tool_ctx,
            "default_system": fam.default_system,
            "sp": layout.chunk_prefix,
        }
        tools_block = _template(layout.tools_block).render(**base) if tool_ctx else ""
        users = [i for i, t in enumerate(turns) if t.role == "user"]
        first_user, last_user = (users[0], users[-1]) if users else (-1, -1)
        first_system = next((i for i, t in enumerate(turns) if t.role == "system"), -1)
        place = layout.tools_placement
        tools_at = {
            "first_system": first_system if first_system >= 0 and turns[first_system].index <= 0 else -2,
            "first_user": first_user,
            "last_user": last_user,
            "own_user_turn": -2,
        }[place]
        parts: list[str] = [layout.bos]
        i = 0
        while i < len(turns):
            t = turns[i]
            ctx = {
                **base,
                "m": t,
                "label": t.label,
                "content": t.content,
                "tools_block": tools_block if i == tools_at else "",
                "is_first_user": i == first_user,
                "is_last_user": i == last_user,
                "system": system_text if i == last_user else "",
                "first": i == 0,
            }
            if t.role == "tool":
                group = [t]
                if layout.group_tool_results:
                    while i + 1 < len(turns) and turns[i + 1].role == "tool":
                        i += 1
                        group.append(turns[i])
                    parts.append(
                        _template(layout.tool_results).render(
                            **ctx, results=[_result(r, layout) for r in group]
                        )
                    )
                else:
                    parts.append(_template(layout.tool_result).render(**ctx, r=_result(t, layout)))
            elif t.role == "assistant":
                calls = [
                    _template(layout.call).render(
                        **base, c=c, name=c.name, arguments=c.arguments, args=c.args, id=c.id
                    )
                    for c in t.calls
                ]
                parts.append(
                    _template(layout.assistant).render(
                        **ctx, calls=calls, calls_text=layout.call_separator.join(calls), call_list=t.calls
                    )
                )
            else:
                parts.append(_template(getattr(layout, t.role)).render(**ctx))
            if place == "own_user_turn" and tool_ctx and t.role == "system" and i == first_system:
                parts.append(_template(layout.user).render(**{**ctx, **_own_tools_turn(tools_block)}))
            i += 1
        if place == "own_user_turn" and tool_ctx and first_system < 0:
            parts.insert(
                1, _template(layout.user).render(**{**base, "m": None, **_own_tools_turn(tools_block)})
            )
        if add_generation_prompt:
            parts.append(layout.generation_prompt)
        names = tuple(str(t.get("function", {}).get("name", "")) for t in tools or [])
        return _extract("".join(parts), names)


def _own_tools_turn(tools_block: str) -> dict[str, Any]:
    return {
        "label": "tools block",
        "content": "",
        "tools_block": tools_block,
        "is_first_user": False,
        "is_last_user": False,
        "system": "",
        "first": False,
    }


def _result(m: _Msg, layout: Any) -> dict[str, Any]:
    value: Any = m.content
    if layout.tool_result_content == "json_or_text":
        try:
            value = json.loads(m.content) if m.content else {}
        except json.JSONDecodeError:
            value = m.content
    return {"label": m.label, "content": m.content, "value": value, "id": m.tool_call_id, "name": m.name}


def _sort_results(msgs: list[_Msg]) -> list[_Msg]:
    """Each run of tool results put in the order of the calls of the assistant turn before it."""
    out: list[_Msg] = []
    order: dict[str, int] = {}
    run: list[_Msg] = []
    for m in [*msgs, None]:
        if m is not None and m.role == "tool":
            run.append(m)
            continue
        if run:
            out += sorted(run, key=lambda r: order.get(r.tool_call_id or "", len(order)))
            run = []
        if m is None:
            break
        if m.role == "assistant":
            order = {c.id: k for k, c in enumerate(m.calls) if c.id}
        out.append(m)
    return out


def _extract(marked: str, tool_names: tuple[str, ...]) -> RenderedPrompt:
    """Strip the seg() markers, keeping each marked span as a labelled Segment."""
    text: list[str] = []
    segments: list[Segment] = []
    length = 0
    pos = 0
    while True:
        start = marked.find(_OPEN, pos)
        if start < 0:
            text.append(marked[pos:])
            break
        text.append(marked[pos:start])
        length += start - pos
        mid = marked.index(_MID, start)
        end = marked.index(_CLOSE, mid)
        body = marked[mid + 1 : end]
        segments.append(Segment(length, length + len(body), marked[start + 1 : mid]))
        text.append(body)
        length += len(body)
        pos = end + 1
    return RenderedPrompt("".join(text), tuple(segments), tool_names)


def call_id(style: Mapping[str, Any], request_id: str, index: int) -> str:
    """The id of our reply's ``index``-th tool call, in the family's format (family ``call_id``).

    ``{length: 9, alphabet: alnum}`` (Mistral: 9 letters/digits, derived from the request id);
    else ``{prefix}`` + the request id's tail + ``_index`` (OpenAI-like).
    """
    length = int(style.get("length", 0))
    if length:
        digest = hashlib.sha256(f"{request_id}/{index}".encode()).digest()
        alphabet = string.ascii_letters + string.digits
        return "".join(alphabet[b % len(alphabet)] for b in digest[:length])
    return f"{style.get('prefix', 'call_')}{request_id[-12:]}_{index}"


@cache
def renderer_for(ref: str, date: str | None = None) -> FamilyRenderer:
    return FamilyRenderer(load_family(ref), date)
