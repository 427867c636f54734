"""The ``seg(label, text)`` markers of the family snippets, and stripping them into ``Segment``s.

A snippet wraps a labelled span in three Unicode noncharacters (never valid text: a
message that contains one is refused before rendering); ``extract`` removes them and
keeps each span's offsets and label, which the cache report uses to name what changed.
"""

from __future__ import annotations

from typing import Any

from server.families.rendered import RenderedPrompt, Segment

_OPEN, _MID, _CLOSE = "\ufdd0", "\ufdd1", "\ufdd2"  # Unicode noncharacters: never valid text
MARKERS = (_OPEN, _MID, _CLOSE)


def seg(label: str, text: Any) -> str:
    """The Jinja global ``seg``: ``text`` marked as the segment ``label`` (nothing when empty)."""
    text = str(text)
    return f"{_OPEN}{label}{_MID}{text}{_CLOSE}" if text else ""


def extract(marked: str, tool_names: tuple[str, ...]) -> RenderedPrompt:
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
