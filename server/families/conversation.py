"""A conversation as a family sees it: the request's messages read, checked, normalised.

``read_messages`` turns the OpenAI messages into ``Msg``s (developer → system; call
arguments re-serialized as the vendor template's ``tojson`` writes them, in the client's key
order: no key is sorted anywhere); ``check_rules`` applies the
family's rules (what its format cannot express is a 400 that says how to fix it);
``normalise`` applies its layout (merge consecutive roles, move the system text, sort
and group tool results, default system turn). ``render.py`` renders the result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from server.errors import InvalidRequest
from server.families.family import Family
from server.families.markers import MARKERS


def dump_json(value: Any, ascii: bool = False) -> str:
    """JSON as the chat templates' ``tojson`` writes it: keys in the order given (the client's),
    ``", "`` / ``": "`` separators, non-ASCII kept unless ``ascii``."""
    return json.dumps(value, ensure_ascii=ascii)


def template_arguments(arguments: str) -> str:
    """Tool-call arguments as the history renders them (``dump_json``, the client's key order)
    when they are JSON, else unchanged."""
    try:
        return dump_json(json.loads(arguments))
    except (json.JSONDecodeError, TypeError):
        return arguments


@dataclass
class Call:
    index: int
    id: str | None
    name: str
    arguments: str  # as the family writes it (JSON text in the client's key order, or the raw text)
    args: Any  # parsed (keys in the client's order), or the raw text when not JSON


@dataclass
class Msg:
    index: int
    role: str  # system | user | assistant | tool
    content: str
    calls: list[Call] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None  # for tool results: the called function's name
    reasoning: str | None = None  # an assistant turn's reasoning (a family with ``reasoning``)

    @property
    def label(self) -> str:
        if self.role == "system" and self.index == 0:
            return "system message"
        if self.index < 0:
            return "default system message" if self.role == "system" else f"added {self.role} message"
        return f"message {self.index} ({self.role})"


def message_text(msg: Any, index: int) -> str:
    content = msg.content
    if isinstance(content, list):
        for part in content:
            if part.type != "text":
                raise InvalidRequest(
                    f"messages[{index}].content has a part of type {part.type!r}: only 'text' parts are "
                    f"supported by this model",
                    param=f"messages[{index}].content",
                )
    text: str = msg.text()
    if any(c in text for c in MARKERS):
        raise InvalidRequest(
            f"messages[{index}].content contains a Unicode noncharacter (U+FDD0..U+FDD2): remove it",
            param=f"messages[{index}].content",
        )
    return text


def _call(family: Family, call: Any, index: int, where: str) -> Call:
    raw = call.function.arguments
    try:
        parsed = json.loads(raw) if raw.strip() else {}
        is_json = True
    except json.JSONDecodeError:
        parsed, is_json = raw, False
    rules, layout = family.rules, family.layout
    if rules.arguments_must_be_object and not isinstance(parsed, dict):
        raise InvalidRequest(
            f"{where}.function.arguments is not a JSON object: the {family.name} family writes "
            f"call arguments as a JSON object; send the arguments as a JSON object string",
            param=f"{where}.function.arguments",
        )
    text = dump_json(parsed, ascii=layout.arguments_json == "ascii") if is_json else raw
    return Call(index, call.id, call.function.name, text, parsed)


def read_messages(family: Family, messages: Sequence[Any]) -> list[Msg]:
    """The request's messages as the family sees them (developer is system; arguments parsed)."""
    out = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        calls = [
            _call(family, c, j, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m.tool_calls or [])
        ]
        msg = Msg(i, role, message_text(m, i), calls if role == "assistant" else [], m.tool_call_id, m.name)
        if role == "assistant" and family.reasoning is not None:
            given = getattr(m, "reasoning_content", None) or getattr(m, "reasoning", None)
            if given is not None:  # as the vendor template reads it: the field wins over the text
                if isinstance(given, str) and any(c in given for c in MARKERS):
                    raise InvalidRequest(
                        f"messages[{i}].reasoning_content contains a Unicode noncharacter (U+FDD0..U+FDD2): "
                        "remove it",
                        param=f"messages[{i}].reasoning_content",
                    )
                msg.reasoning = given
            else:
                msg.reasoning, msg.content = family.reasoning.split(msg.content)
        out.append(msg)
    return out


def check_rules(family: Family, msgs: list[Msg]) -> None:
    """The family's rules: what its format cannot express is a 400 that says how to fix it."""
    rules, name = family.rules, family.name
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


def normalise(family: Family, msgs: list[Msg], has_tools: bool) -> tuple[list[Msg], str]:
    """The turns the family renders (merged, reordered, defaults added) and the system text it
    moves into the last user turn (layout ``system_placement: last_user``), else ""."""
    layout = family.layout
    system_text = ""
    if layout.system_placement == "last_user":
        systems = [m.content for m in msgs if m.role == "system" and m.content]
        system_text = layout.merge_separator.join(systems)
        msgs = [m for m in msgs if m.role != "system"]
    if layout.system_placement == "front":  # one system turn first, every system text in it
        found = [m for m in msgs if m.role == "system"]
        joined = layout.merge_separator.join(m.content for m in found)
        index = 0 if found and found[0].index == 0 else -1
        msgs = [Msg(index, "system", joined)] + [m for m in msgs if m.role != "system"]
    # each run of same-role messages joined once (joining pairwise re-copied the run at every
    # step: 4,096 consecutive user messages took 14.9 s)
    merged: list[Msg] = []
    run: list[Msg] = []
    for m in [*msgs, None]:
        if m is not None and run and run[-1].role == m.role and m.role in layout.merge_consecutive:
            run.append(m)
            continue
        if len(run) == 1:
            merged.append(run[0])
        elif run:
            first = run[0]
            text = layout.merge_separator.join(r.content for r in run if r.content)
            calls = [c for r in run for c in r.calls]
            merged.append(Msg(first.index, first.role, text, calls, first.tool_call_id, first.name))
        run = [m] if m is not None else []
    if layout.sort_tool_results_by_call:
        merged = sort_results(merged)
    if layout.empty_user_first and (not merged or merged[0].role != "user"):
        merged.insert(0, Msg(-1, "user", ""))
    if layout.always_system_turn and not any(m.role == "system" for m in merged[:1]):
        merged.insert(0, Msg(-1, "system", family.default_system))
    elif (
        layout.system_placement == "turn"
        and (family.default_system or (has_tools and layout.system_turn_with_tools))
        and (has_tools or not layout.default_system_only_with_tools)
        and (not merged or merged[0].role != "system")
    ):
        merged.insert(0, Msg(-1, "system", family.default_system))
    return merged, system_text


def sort_results(msgs: list[Msg]) -> list[Msg]:
    """Each run of tool results put in the order of the calls of the assistant turn before it."""
    out: list[Msg] = []
    order: dict[str, int] = {}
    run: list[Msg] = []
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
