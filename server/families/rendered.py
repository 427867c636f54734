"""A rendered prompt: its text plus labelled character segments (to explain a cache miss);
``PromptRenderer``, what the chat service reads of a family's renderer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from server.families.reasoning import Reasoning


@dataclass(frozen=True)
class Segment:
    start: int  # character offsets in the rendered text, end exclusive
    end: int
    label: str  # "system message", "tools block", "message 3 (user)", ...


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    segments: tuple[Segment, ...]
    tool_names: tuple[str, ...]
    # What the renderer noticed, for the cache report: "template_rewrote_history" when a model's
    # own chat template changed earlier turns (the previous prompt is then no prefix of this one).
    notes: tuple[str, ...] = ()

    def segment_at(self, char: int) -> Segment | None:
        for seg in self.segments:
            if seg.start <= char < seg.end:
                return seg
        return None


@runtime_checkable
class PromptRenderer(Protocol):
    """What the chat service reads of a family's renderer (FamilyRenderer, ModelTemplateRenderer).

    The one seam between a request and its family: the prompt, the family's reasoning block
    (None: the model does not reason, or the renderer cannot know it) and why tools cannot be
    served (None: they can). ``reasoning_effort``: the request's, for a family whose prompt says it
    (gpt-oss: "Reasoning: low|medium|high"); the others ignore it.
    """

    @property
    def reasoning(self) -> Reasoning | None: ...

    @property
    def tools_unsupported(self) -> str | None: ...

    def render(
        self,
        messages: Sequence[Any],
        tools: Sequence[dict[str, Any]] | None,
        add_generation_prompt: bool = True,
        reasoning_effort: str | None = None,
    ) -> RenderedPrompt: ...
