"""How a family's model reasons before it answers, as data (``reasoning:`` in a family file).

Qwen3 writes ``<think>\\n…\\n</think>\\n\\n`` and then its answer (text or tool calls)::

    reasoning:
      open: "<think>\\n"          # written (forced by the masks) at the start of a reasoning reply
      close: "\\n</think>\\n\\n"   # forced when the reasoning budget is spent; its stripped form
                                 # (the close tag "</think>") is what ends the reasoning
      history: after_last_user   # which past reasoning the vendor's template renders
      disabled: "<think>\\n\\n</think>\\n\\n"  # the generation prompt's tail when reasoning is off
      trim: true                 # newlines around the reasoning and before the answer are dropped
                                 # (Qwen3's template); Mistral: false, the text as written

Nothing here names a family: the masks (server/constrain/reasoning_matcher.py), the reply
parser (server/chat/reasoning_reply.py) and the history renderer (server/families/render.py)
read these strings. A family whose reasoning is a channel rather than tags (Harmony's
analysis channel) or whose tags are special tokens (Mistral's ``[THINK]``) fits the same
fields: ``open`` / ``close`` may be special-token text.

``history``: ``after_last_user`` (Qwen3: the reasoning of assistant turns before the last
user message is dropped), ``until_answer`` (gpt-oss: a tool-call turn keeps its reasoning
until a later assistant turn answers without calls; a plain answer never shows it), ``all``
(every turn keeps its reasoning) or ``none`` (dropped everywhere). Dropping is a rewrite of
the history: the previous turn's prompt is no longer
a prefix of this one, and the cache report names it (``template_rewrote_history``); the
setting ``keep_reasoning`` renders every turn's reasoning instead so a session stays
append-only.

Effort → budget (tokens of reasoning before the close is forced), the same for every
family unless its file sets ``efforts``: ``minimal`` 64, ``low`` 512, ``medium`` 2048,
``high`` 8192, ``xhigh`` 16384; ``none`` turns reasoning off (the ``disabled`` tail is rendered).
``answer_open`` (Harmony: ``<|channel|>final<|message|>``): the header the masks force before a
plain-text answer (the model picks it or a call's opening right after the close); the reply
parser drops it from the content. A close that begins with a special token (Harmony's
``<|end|><|start|>assistant``) ends at that token; the masks force the rest.

The Messages API's ``thinking.budget_tokens`` and the ``max_reasoning_tokens`` extension give
the budget in tokens directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HISTORY_MODES = ("after_last_user", "until_answer", "all", "none")
DEFAULT_EFFORTS: dict[str, int] = {"minimal": 64, "low": 512, "medium": 2048, "high": 8192, "xhigh": 16384}


@dataclass(frozen=True)
class Reasoning:
    open: str
    close: str
    history: str = "after_last_user"
    disabled: str = ""  # the generation prompt's tail with reasoning off ("" : cannot be turned off)
    answer_open: str = ""  # the header a plain-text answer begins with after the reasoning (Harmony's)
    # strip the newlines around the reasoning and before the answer (Qwen3's template does; False:
    # the text is kept as written, as mistral-common renders a ThinkChunk and the text after it)
    trim: bool = True
    efforts: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_EFFORTS))

    def __post_init__(self) -> None:
        if not self.open.strip() or not self.close.strip():
            raise ValueError(
                "reasoning: open and close must hold a tag (e.g. '<think>\\n', '\\n</think>\\n\\n')"
            )
        if self.history not in HISTORY_MODES:
            raise ValueError(f"reasoning: history must be one of {HISTORY_MODES}, got {self.history!r}")
        bad = {k: v for k, v in self.efforts.items() if not isinstance(v, int) or v < 0}
        if bad:
            raise ValueError(f"reasoning: efforts must map names to token counts >= 0, got {bad}")

    @property
    def open_tag(self) -> str:
        return self.open.strip()

    @property
    def close_tag(self) -> str:
        return self.close.strip()

    def budget_for(self, effort: str) -> int:
        """The token budget of an effort name (ValueError naming the known ones)."""
        if effort not in self.efforts:
            raise ValueError(
                f"unknown reasoning effort {effort!r}: use one of {sorted(self.efforts)} or 'none'"
            )
        return self.efforts[effort]

    def split(self, text: str) -> tuple[str | None, str]:
        """A reply or history message's text → (reasoning, content), as the vendor template does.

        The reasoning is the text between the open and close tags, stripped of newlines (the
        template writes it back as ``open + reasoning + close``); the content is what follows
        the close tag, less leading newlines. Text without a close tag is all content.
        """
        if self.close_tag not in text:
            return None, text
        parts = text.split(self.close_tag)
        reasoning, content = parts[0].split(self.open_tag)[-1], parts[-1]
        return (reasoning.strip("\n"), content.lstrip("\n")) if self.trim else (reasoning, content)

    def render(self, reasoning: str, content: str) -> str:
        """An assistant turn's text with its reasoning, as the model wrote it (Qwen3's template)."""
        if not self.trim:
            return self.open + reasoning + self.close + content
        return self.open + reasoning.strip("\n") + self.close + content.lstrip("\n")


def parse_reasoning(data: Any, where: str) -> Reasoning | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: reasoning must be a mapping with open and close")
    known = set(Reasoning.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown reasoning fields {unknown}; the fields are {sorted(known)}")
    data = dict(data)
    if "efforts" in data:
        data["efforts"] = {**DEFAULT_EFFORTS, **data["efforts"]}
    try:
        return Reasoning(**data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
