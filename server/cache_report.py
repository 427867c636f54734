"""Cache report: how much of a prompt came from cache and, when a session's prefix broke, where and why.

Each session remembers its previous rendered prompt (token ids, text, labelled
segments). A new prompt of the session should extend the previous one (agent
contexts are append-only). When it does not, the report names the first token
that differs (``diverged_at_token``) and a one-line ``reason``: the segment where
the first character differs (system message, tools block, message k) and the text
around it, before and after. When the prefix was kept but fewer tokens came from
cache than it covers, the reason says so (evicted, or cache off).
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from server.families.rendered import RenderedPrompt

SNIPPET = 24  # characters shown on each side of the first difference


@dataclass(frozen=True)
class SessionPrompt:
    token_ids: array
    char_offsets: array  # start character of each token
    rendered: RenderedPrompt


@dataclass(frozen=True)
class CacheExplanation:
    diverged_at_token: int | None
    reason: str | None
    kind: str  # "extended" | "new_session" | "diverged" | "evicted" | "disabled" (metrics label)


def common_prefix(a: array | list[int], b: array | list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    step = 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _snippet(text: str, at: int) -> str:
    start = max(0, at - SNIPPET)
    end = min(len(text), at + SNIPPET)
    return ("…" if start else "") + text[start:at] + "‸" + text[at:end] + ("…" if end < len(text) else "")


def _tools_change(prev: RenderedPrompt, cur: RenderedPrompt) -> str | None:
    if prev.tool_names == cur.tool_names:
        return None
    removed = [n for n in prev.tool_names if n not in cur.tool_names]
    added = [n for n in cur.tool_names if n not in prev.tool_names]
    if not removed and not added:
        return "tool list reordered (mask tools instead of removing or reordering them)"
    parts = []
    if removed:
        parts.append(f"removed {removed}")
    if added:
        parts.append(f"added {added}")
    return "tool list changed: " + ", ".join(parts) + " (keep tools fixed and mask them instead)"


def explain(
    prev: SessionPrompt | None,
    cur: SessionPrompt,
    cached_tokens: int,
    block_size: int,
    cache_enabled: bool = True,
) -> CacheExplanation:
    if prev is None:
        return CacheExplanation(None, None, "new_session")
    lcp = common_prefix(prev.token_ids, cur.token_ids)
    if lcp < len(prev.token_ids):
        return CacheExplanation(lcp, _divergence_reason(prev, cur, lcp), "diverged")
    if not cache_enabled:
        return CacheExplanation(None, "prefix cache is off (prefix_cache.enabled: false)", "disabled")
    reusable = (len(prev.token_ids) // block_size) * block_size
    if cached_tokens < min(reusable, len(cur.token_ids) - 1) - block_size:
        return CacheExplanation(
            None,
            f"previous prompt kept as prefix, but only {cached_tokens} of its {len(prev.token_ids)} "
            "tokens were still cached (evicted: raise prefix_cache.memory_mb; or another worker served it)",
            "evicted",
        )
    return CacheExplanation(None, None, "extended")


def _divergence_reason(prev: SessionPrompt, cur: SessionPrompt, lcp: int) -> str:
    tools = _tools_change(prev.rendered, cur.rendered)
    a, b = prev.rendered.text, cur.rendered.text
    # the first differing character, searched from the start of the diverging token
    start = prev.char_offsets[lcp] if lcp < len(prev.char_offsets) else len(a)
    start = min(start, cur.char_offsets[lcp] if lcp < len(cur.char_offsets) else len(b))
    at = start
    while at < len(a) and at < len(b) and a[at] == b[at]:
        at += 1
    seg = cur.rendered.segment_at(at) or prev.rendered.segment_at(at)
    where = (
        f"{seg.label} changed at character {at - seg.start}" if seg else f"prompt changed at character {at}"
    )
    if at >= len(b):
        where = "the prompt is shorter than the previous one (messages were dropped or truncated)"
    detail = f"{where}: {_snippet(a, at)!r} -> {_snippet(b, at)!r}"
    return f"{tools}; {detail}" if tools else detail


class SessionTable:
    """The previous prompt of each recent session (LRU, bounded)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, SessionPrompt] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> SessionPrompt | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: str, prompt: SessionPrompt) -> None:
        with self._lock:
            self._items[key] = prompt
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
