"""A rendered prompt: its text plus labelled character segments (to explain a cache miss)."""

from __future__ import annotations

from dataclasses import dataclass


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
