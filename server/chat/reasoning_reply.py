"""A reasoning family's reply: the request's reasoning settings, and the reply split into reasoning + answer.

Settings (every dialect maps onto the chat fields): ``max_reasoning_tokens`` (extension; the
Messages API's ``thinking.budget_tokens``) wins over ``reasoning_effort`` (Chat Completions;
the Responses API's ``reasoning.effort``), whose names map to budgets by the family's
``efforts`` table (server/families/reasoning.py). ``reasoning_effort: "none"`` turns reasoning
off: the family's ``disabled`` tail ends the prompt, or, for a family that always reasons (no
such tail: gpt-oss, Magistral), a budget of 0 closes the reasoning at once (empty); neither field: the model
reasons with no budget but ``max_tokens``.

``ReasoningSplitter`` splits the reply's text, whole or streamed, the same way: everything
before the close tag (less the open tag and the newlines around it) is the reasoning, the rest
(less its leading newlines and, for Harmony, the final channel's header ``answer_open``) goes to
the tool-call parser. A ``<tool_call>`` inside the
reasoning is reasoning text, never a call. A reply cut inside its reasoning has reasoning only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from server.constrain.plan import ReasoningPlan, ToolPlan
from server.errors import InvalidRequest
from server.families.reasoning import Reasoning
from server.protocol import ChatCompletionRequest


@dataclass(frozen=True)
class ReasoningChoice:
    plan: ReasoningPlan | None  # the masks' reasoning phase (None: no reasoning)
    lead: str = ""  # appended to the prompt (reasoning turned off)


def choose_reasoning(
    family: Reasoning | None, effort: str | None, max_tokens: int | None, param: str = "reasoning_effort"
) -> ReasoningChoice:
    """The request's reasoning: on (with a budget when asked), or off; nothing for a plain family."""
    if family is None:
        return ReasoningChoice(None)
    if effort == "none" and max_tokens is None:
        if family.disabled:  # the family's off switch: its tail ends the prompt, no reasoning is written
            return ReasoningChoice(None, family.disabled)
        max_tokens = 0  # a model that always reasons (gpt-oss, Magistral): its reasoning closes at once
    budget = max_tokens
    if budget is None and effort is not None:
        try:
            budget = family.budget_for(effort)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param=param) from None
    plan = ReasoningPlan(family.open, family.close, budget, answer_open=family.answer_open, trim=family.trim)
    return ReasoningChoice(plan)


class ReasoningSplitter:
    """Feed the reply's text; get (reasoning delta, answer delta) pairs that add up to the whole."""

    def __init__(self, plan: ReasoningPlan) -> None:
        self.open_tag, self.close_tag = plan.open.strip(), plan.close.strip()
        self.answer_open = plan.answer_open  # Harmony's final-channel header: not part of the content
        self._head = ""  # the answer's start while it may still be (a prefix of) answer_open
        self.trim = plan.trim  # False: newlines around the reasoning are kept (the text as written)
        self._buf = ""
        self._thinking = True
        self._opened = False  # the open tag (if any) is behind us
        self._said = False  # some reasoning text was emitted (leading newlines are dropped before)
        self._answer_started = False
        self.reasoning_parts: list[str] = []

    @property
    def reasoning(self) -> str | None:
        return "".join(self.reasoning_parts) or None

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        if not self._thinking:
            return "", self._answer(self._take())
        if not self._opened:
            # newlines before the open tag (GLM-4.5's "\n<think>") are not reasoning when trimmed
            head = self._buf.lstrip("\n") if self.trim else self._buf
            if len(head) < len(self.open_tag) and self.open_tag.startswith(head):
                return "", ""
            if head.startswith(self.open_tag):
                self._buf = head[len(self.open_tag) :]
            self._opened = True
        at = self._buf.find(self.close_tag)
        if at >= 0:
            head, rest = self._buf[:at], self._buf[at + len(self.close_tag) :]
            head = head.rstrip("\n") if self.trim else head
            self._buf, self._thinking = "", False
            return self._say(head), self._answer(rest)
        keep = _partial_suffix(self._buf, self.close_tag)
        head = self._buf[: len(self._buf) - keep]
        out = head.rstrip("\n") if self.trim else head  # trailing newlines wait: they may precede the close
        self._buf = self._buf[len(out) :]
        return self._say(out), ""

    def finish(self) -> tuple[str, str]:
        """The rest: a reply cut inside its reasoning keeps that text as reasoning."""
        if self._thinking:
            rest, self._buf = self._buf, ""
            if not self._opened and self.open_tag.startswith(rest.lstrip("\n") if self.trim else rest):
                rest = ""
            return self._say(rest.rstrip("\n") if self.trim else rest), ""
        out = self._answer(self._take())
        if self._head:  # a cut reply that began like the header: its text stays
            out, self._head = out + self._head, ""
        return "", out

    def _take(self) -> str:
        out, self._buf = self._buf, ""
        return out

    def _say(self, text: str) -> str:
        if not self._said and self.trim:
            text = text.lstrip("\n")
        if text:
            self._said = True
            self.reasoning_parts.append(text)
        return text

    def _answer(self, text: str) -> str:
        if self._answer_started:
            return text
        if self.trim:
            text = text.lstrip("\n")
        if self.answer_open:
            head = self._head + text
            if len(head) < len(self.answer_open) and self.answer_open.startswith(head):
                self._head = head  # could still be the header: wait
                return ""
            self._head = ""
            if head.startswith(self.answer_open):
                self._answer_started = True  # the content is exactly what follows the header
                return head[len(self.answer_open) :]
            text = head
        self._answer_started = bool(text)
        return text


def _partial_suffix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def with_reasoning(plan: ToolPlan, family: Reasoning | None, req: ChatCompletionRequest) -> ToolPlan:
    """The tool plan with the request's reasoning (the masks let the model reason first; the tool
    constraint, or response_format's, applies once the reasoning closes)."""
    param = "max_reasoning_tokens" if req.max_reasoning_tokens is not None else "reasoning_effort"
    choice = choose_reasoning(family, req.reasoning_effort, req.max_reasoning_tokens, param)
    return replace(plan, reasoning=choice.plan, lead=choice.lead)
