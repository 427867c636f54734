"""What the masks enforce for one request: the tool mode, the allowed names, the prefill.

Chat decides the plan (``server/chat/tool_choice.py``: ``tool_choice`` or the state
machine); the mask library and both engines only read it. ``tool_names`` validates the
names the trie is built over.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, asdict, dataclass
from typing import Any, Literal

from server.constrain.errors import ConstraintError
from server.constrain.trie import name_char_ok

Mode = Literal["none", "auto", "required"]  # a tool mode (tool_choice's string forms)
MODES: tuple[Mode, ...] = ("none", "auto", "required")


@dataclass(frozen=True)
class ReasoningPlan:
    """A reasoning family's reply: reasoning first (``server/constrain/reasoning_matcher.py``)."""

    open: str  # forced at the start of the reply ("<think>\n")
    close: str  # its stripped form ends the reasoning; forced whole when the budget is spent
    budget: int | None = None  # reasoning tokens before the close is forced (None: no limit)
    _: KW_ONLY  # the family's details, by name (two merged branches once disagreed on their order)
    answer_open: str = ""  # forced before a plain-text answer (Harmony's final-channel header)
    trim: bool = True  # the reply parser strips newlines around the reasoning (the family's ``trim``)


@dataclass(frozen=True)
class ToolPlan:
    mode: Mode
    allowed: tuple[str, ...]  # allowed tool names, in the order of `tools`
    parallel: bool  # parallel_tool_calls
    # the call's opening for required / named modes: appended right after the assistant header,
    # or, with ``reasoning``, forced by the masks once the reasoning closes; may be ""
    prefill: str
    state: str | None = None  # state-machine state that chose this plan (None: explicit tool_choice)
    reasoning: ReasoningPlan | None = None  # the model reasons first, then this plan applies
    lead: str = ""  # text appended to the prompt before the prefill (a family's "reasoning off" tail)
    # calls the conversation already holds: an envelope whose call id is the running index of the
    # calls (Kimi's functions.NAME:IDX, `call_id_counts`) has the masks write this + k for the k-th
    first_call_index: int = 0

    @property
    def prompt_prefill(self) -> str:
        """What the prompt gets after the assistant header (the masks force the rest)."""
        return self.lead + ("" if self.reasoning is not None else self.prefill)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["allowed"] = list(self.allowed)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolPlan:
        r = d.get("reasoning")
        reasoning = (
            ReasoningPlan(
                str(r["open"]),
                str(r["close"]),
                r.get("budget"),
                answer_open=str(r.get("answer_open", "")),
                trim=bool(r.get("trim", True)),
            )
            if r
            else None
        )
        if reasoning is not None and reasoning.budget is not None and not isinstance(reasoning.budget, int):
            raise ValueError(f"reasoning.budget must be a token count, got {reasoning.budget!r}")
        return cls(
            d["mode"],
            tuple(d["allowed"]),
            bool(d["parallel"]),
            d["prefill"],
            d.get("state"),
            reasoning,
            str(d.get("lead", "")),
            int(d.get("first_call_index", 0)),
        )


def tool_names(tools: list[dict[str, Any]] | None) -> tuple[str, ...]:
    """The function names of OpenAI tool dicts, validated (400 on a missing or duplicate name)."""
    names: list[str] = []
    for i, tool in enumerate(tools or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise ConstraintError(
                f"tools[{i}] has no function name: write {{'type': 'function', 'function': {{'name': ...}}}}",
                param=f"tools[{i}].function.name",
            )
        if not all(map(name_char_ok, name)):
            raise ConstraintError(
                f"tool name {name!r} contains a quote, backslash or whitespace: "
                "use letters, digits, '_', '-', '.'",
                param=f"tools[{i}].function.name",
            )
        if name in names:
            raise ConstraintError(
                f"tool name {name!r} appears twice in tools: names must be unique", param="tools"
            )
        names.append(name)
    return tuple(names)
