"""Data-driven prompt rendering: a family file's Jinja snippets -> text + labelled segments.

One renderer for every family: it normalises the conversation as the family's layout
says (merge consecutive roles, move the system text, group tool results), checks the
family's rules (a 400 that says what and how to fix), and renders each turn with the
family's snippet. Snippets mark labelled spans with ``seg(label, text)``; the markers
become ``Segment``s (the cache report names the part of the prompt that changed).

Fidelity: tool definitions and call arguments reach the snippets as the client sent them,
keys in the client's order (as the vendors' chat templates render them: nothing is
sorted); JSON is written with fixed separators; the date a family prints is pinned
(family data or config), never read from the clock.
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from server.families.conversation import Msg, check_rules, dump_json, normalise, read_messages
from server.families.family import Family, load_family
from server.families.markers import extract, seg
from server.families.model_template import REWROTE_HISTORY
from server.families.reasoning import Reasoning
from server.families.rendered import RenderedPrompt


def _json(value: Any, indent: int | None = None, ascii: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ascii, indent=indent, separators=None if indent else (", ", ": "))


def _pyval(value: Any, json: bool = True) -> str:
    """A value as Jinja's ``| string`` writes it (True, 3, 1.5), JSON for objects and arrays."""
    if json and isinstance(value, (dict, list)):
        return _json(value)
    return str(value)


@cache
def _env() -> jinja2.Environment:
    env = ImmutableSandboxedEnvironment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )
    env.filters["json"] = _json
    env.filters["pyval"] = _pyval
    env.globals["seg"] = seg
    return env


@cache
def _template(source: str) -> jinja2.Template:
    return _env().from_string(source)


class FamilyRenderer:
    """Renders conversations for one family (``render``), with the family's pinned date."""

    def __init__(self, family: Family | str, date: str | None = None, keep_reasoning: bool = False) -> None:
        self.family = load_family(family) if isinstance(family, str) else family
        self.date = date or self.family.date or ""
        self.keep_reasoning = keep_reasoning  # render every past turn's reasoning (append-only)

    # -- the seam the chat service reads (server.families.rendered.PromptRenderer) -----------
    @property
    def reasoning(self) -> Reasoning | None:
        return self.family.reasoning

    @property
    def tools_unsupported(self) -> str | None:
        return self.family.rules.tools_unsupported

    # -- input -> normalised messages --------------------------------------------------
    def _tools(self, tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for tool in tools:
            fn = {k: v for k, v in tool.get("function", {}).items() if k != "strict"}
            as_sent = {**tool, "function": fn}
            out.append(
                {
                    "name": fn.get("name", ""),
                    "description": fn.get("description"),
                    "parameters": fn.get("parameters"),
                    "function": fn,
                    "tool": as_sent,  # the tool as the client sent it (less "strict")
                    "json": dump_json(tool),
                }
            )
        return out

    def render(
        self,
        messages: Sequence[Any],
        tools: Sequence[dict[str, Any]] | None,
        add_generation_prompt: bool = True,
        reasoning_effort: str | None = None,
    ) -> RenderedPrompt:
        fam, layout = self.family, self.family.layout
        msgs = read_messages(fam, messages)
        check_rules(fam, msgs)
        turns, system_text = normalise(fam, msgs, bool(tools))
        tool_ctx = self._tools(list(tools or []))
        base = {
            "date": self.date,
            "reasoning_effort": reasoning_effort,  # the request's (None: not sent)
            "tools": tool_ctx,
            "default_system": fam.default_system,
            "sp": layout.chunk_prefix,
        }
        tools_block = _template(layout.tools_block).render(**base) if tool_ctx else ""
        users = [i for i, t in enumerate(turns) if t.role == "user"]
        first_user, last_user = (users[0], users[-1]) if users else (-1, -1)
        first_system = next((i for i, t in enumerate(turns) if t.role == "system"), -1)
        shows = reasoning_shown(fam.reasoning, turns, last_user, self.keep_reasoning)
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
                "prev": turns[i - 1].role if i else "",  # the role of the turn before
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
                think, content = "", t.content
                if fam.reasoning is not None and shows[i]:
                    think = fam.reasoning.render(t.reasoning or "", "")
                    content = content.lstrip("\n") if fam.reasoning.trim else content
                parts.append(
                    _template(layout.assistant).render(
                        **{**ctx, "content": content},
                        think=think,
                        reasoning=t.reasoning or "",
                        shown=shows[i],
                        keep=self.keep_reasoning,
                        calls=calls,
                        calls_text=layout.call_separator.join(calls),
                        call_list=t.calls,
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
            last = turns[-1].role if turns else ""
            parts.append(_template(layout.generation_prompt).render(**base, last=last))
        names = tuple(str(t.get("function", {}).get("name", "")) for t in tools or [])
        out = extract("".join(parts), names)
        dropped = [t.index for t, shown in zip(turns, shows, strict=True) if t.reasoning and not shown]
        notes: list[str] = []
        if fam.reasoning is not None and dropped:  # the history is rewritten: the cache report names it
            rule = fam.reasoning.history
            notes.append(f"reasoning of messages {dropped} not rendered ({rule}; keep_reasoning keeps it)")
        past = [t.index for t in turns if t.role == "assistant"]
        if layout.history_note and past and not self.keep_reasoning:  # e.g. Harmony's call headers
            notes.append(f"messages {past}: {layout.history_note} (keep_reasoning renders them as written)")
        if notes:
            out = replace(out, notes=(*out.notes, REWROTE_HISTORY, *notes))
        return out


def reasoning_shown(
    reasoning: Reasoning | None, turns: Sequence[Msg], last_user: int, keep: bool
) -> list[bool]:
    """Per turn: is its reasoning rendered? The family's ``history`` rule, or every turn with ``keep``.

    ``after_last_user`` is Qwen3's template: an assistant turn after the last user message shows
    its reasoning when it has some (or when it is the conversation's last message).
    ``until_answer`` is gpt-oss's: a turn with calls shows it until a later turn answers without calls.
    """
    if reasoning is None:
        return [False] * len(turns)
    out = []
    for i, t in enumerate(turns):
        has = bool(t.reasoning) or i == len(turns) - 1
        if keep or reasoning.history == "all":
            out.append(t.role == "assistant" and t.reasoning is not None)
        elif reasoning.history == "after_last_user":
            out.append(t.role == "assistant" and i > last_user and has)
        elif reasoning.history == "until_answer":  # gpt-oss: until a later turn answers without calls
            answered = any(u.role == "assistant" and not u.calls for u in turns[i + 1 :])
            out.append(t.role == "assistant" and bool(t.calls) and not answered)
        else:
            out.append(False)
    return out


def _own_tools_turn(tools_block: str) -> dict[str, Any]:
    return {
        "label": "tools block",
        "content": "",
        "tools_block": tools_block,
        "is_first_user": False,
        "is_last_user": False,
        "system": "",
        "first": False,
        "prev": "",
    }


def _result(m: Msg, layout: Any) -> dict[str, Any]:
    value: Any = m.content
    if layout.tool_result_content == "json_or_text":
        try:
            value = json.loads(m.content) if m.content else {}
        except json.JSONDecodeError:
            value = m.content
    return {"label": m.label, "content": m.content, "value": value, "id": m.tool_call_id, "name": m.name}


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
