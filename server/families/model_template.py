"""``model_family: model``: render with the model folder's own Jinja chat template, as vLLM does.

For a model no family file covers. The template comes from ``chat_template.jinja`` or
``tokenizer_config.json`` and runs in Jinja's sandbox with the Hugging Face conventions
(``trim_blocks``, ``lstrip_blocks``, ``tojson``, ``raise_exception``, ``bos_token``...).
Our guarantees hold here too:

- tool definitions and call arguments reach the template as the client sent them (its key
  order); call arguments are handed over as objects, as vLLM does;
- ``strftime_now(fmt)`` (Llama 3.2/3.3 "Today Date") formats a PINNED date (the family
  ``date`` / the ``date`` argument), never the clock, so the prompt does not change per request;
- segment labels come from rendering growing prefixes of the conversation: message i is
  the text that the prefix ending at message i adds (in long conversations, early messages
  are grouped in spans: ``prefix_points``);
- a template that rewrites earlier turns (Qwen3 drops the reasoning of earlier assistant
  turns) is detected: some prefix's render is not a prefix of the whole render. The result
  then carries the note ``template_rewrote_history`` (the cache report names it) and the
  message where it happened.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from server.errors import InvalidRequest
from server.families.reasoning import Reasoning
from server.families.rendered import RenderedPrompt, Segment

REWROTE_HISTORY = "template_rewrote_history"
DEFAULT_DATE = "26 Jul 2024"


def _tojson(
    value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


class ModelTemplateRenderer:
    """Renders conversations with a model's own chat template (``render`` as FamilyRenderer)."""

    def __init__(
        self, template: str, specials: dict[str, str] | None = None, date: str | None = None
    ) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
        env.filters["tojson"] = _tojson
        pinned = datetime.strptime(date or DEFAULT_DATE, "%d %b %Y")
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = pinned.strftime
        self.template = env.from_string(template)
        self.specials = dict(specials or {})
        self.date = date or DEFAULT_DATE

    # -- the seam the chat service reads (server.families.rendered.PromptRenderer) -----------
    @property
    def reasoning(self) -> Reasoning | None:
        """None: a chat template declares no reasoning tags the masks could read."""
        return None

    @property
    def tools_unsupported(self) -> str | None:
        return None

    def _messages(self, messages: Sequence[Any]) -> list[dict[str, Any]]:
        out = []
        for i, m in enumerate(messages):
            d = m.model_dump(exclude_none=True)
            if isinstance(m.content, list):
                d["content"] = m.text()
            for j, call in enumerate(d.get("tool_calls") or []):
                raw = call["function"].get("arguments") or "{}"
                try:
                    call["function"]["arguments"] = json.loads(raw)
                except json.JSONDecodeError:
                    raise InvalidRequest(
                        f"messages[{i}].tool_calls[{j}].function.arguments is not JSON: the model's chat "
                        f"template takes arguments as an object; send a JSON object string",
                        param=f"messages[{i}].tool_calls[{j}].function.arguments",
                    ) from None
            out.append(d)
        return out

    def _render(
        self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool, extra: dict[str, Any]
    ) -> str:
        try:
            return self.template.render(
                messages=msgs,
                tools=tools,
                add_generation_prompt=gen,
                date_string=self.date,
                **extra,
                **self.specials,
            )
        except jinja2.TemplateError as exc:
            raise InvalidRequest(
                f"the model's chat template refused this conversation: {exc}", param="messages"
            ) from None

    def render(
        self,
        messages: Sequence[Any],
        tools: Sequence[dict[str, Any]] | None,
        add_generation_prompt: bool = True,
        reasoning_effort: str | None = None,
    ) -> RenderedPrompt:
        msgs = self._messages(messages)
        tool_list = [dict(t) for t in tools or []] or None
        # the request's effort, for a template that reads it (gpt-oss's "Reasoning: ..." line)
        extra = {"reasoning_effort": reasoning_effort} if reasoning_effort else {}
        text = self._render(msgs, tool_list, add_generation_prompt, extra)
        segments: list[Segment] = []
        notes: list[str] = []
        covered = first = 0  # text covered by segments; the first message the next segment holds
        for k in prefix_points(len(msgs)):
            prefix = self._render(msgs[:k], tool_list, False, extra)
            if not text.startswith(prefix):
                if not notes:
                    notes.append(REWROTE_HISTORY)
                    notes.append(f"rewritten before message {k - 1}")
                common = _common_prefix(prefix, text)
                if common > covered:
                    segments.append(Segment(covered, common, _label(msgs, first, k - 1)))
                    covered, first = common, k
                continue
            if len(prefix) > covered:
                segments.append(Segment(covered, len(prefix), _label(msgs, first, k - 1)))
                covered, first = len(prefix), k
        names = tuple(str(t.get("function", {}).get("name", "")) for t in tools or [])
        return RenderedPrompt(text, tuple(segments), names, tuple(notes))


# Segment labels come from rendering growing prefixes; rendering every prefix is quadratic in the
# message count (4,096 messages: ~8M message renders). Prefixes are rendered at every message of
# the last TAIL and at ~SPREAD evenly spaced points before them: linear work, and a change
# deep in a long history is still localized to a span of ~n/SPREAD messages.
TAIL = 64
SPREAD = 64


def prefix_points(n: int) -> list[int]:
    """The prefix lengths (numbers of messages) to render, ascending, always ending at ``n``."""
    if n <= TAIL + SPREAD:
        return list(range(1, n + 1))
    head = n - TAIL
    step = -(-head // SPREAD)  # ceil
    return [*range(step, head, step), *range(head, n + 1)]


def _label(msgs: list[dict[str, Any]], first: int, last: int) -> str:
    if first >= last:
        return f"message {last} ({msgs[last].get('role')})"
    return f"messages {first}-{last}"


def _common_prefix(a: str, b: str) -> int:
    """Length of the common prefix (binary search over slice compares: C speed, no per-character loop)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
