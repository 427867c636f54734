"""Where two prompts diverge (the part, the character, a quote of the current prompt around it and
only a digest of the baseline's), and which change there explains the miss."""

from __future__ import annotations

import hashlib
from typing import Any

import server.cache_diag.fixes as fixes
from server.cache_diag.changes import (
    Change,
    changed_settings,
    key_order_change,
    structural_changes,
)
from server.cache_diag.diagnosis import REWRITE, Diagnosis, Prompt

SNIPPET = 24  # characters shown on each side of the first difference


def locate(prev: Prompt, cur: Prompt, lcp: int) -> tuple[int, bool, str]:
    """(first differing character in the current prompt, exact?, today's one-line text)."""
    text = cur.text or ""
    offsets = cur.offsets
    if offsets is not None and lcp < len(offsets):
        start = offsets[lcp]
    else:
        start = len(text)
    exact = prev.text is not None
    if exact:
        a = prev.text or ""
        if prev.offsets is not None and lcp < len(prev.offsets):
            start = min(start, prev.offsets[lcp])
        at = start
        while at < len(a) and at < len(text) and a[at] == text[at]:
            at += 1
    else:
        at = start
    seg = next((s for s in cur.fp.segments if s.char_start <= at < s.char_end), None)
    if seg is None:
        seg = next((s for s in prev.fp.segments if s.char_start <= at < s.char_end), None)
    if at >= len(text):
        where = "the prompt is shorter than the previous one (messages were dropped or truncated)"
    elif seg is not None:
        where = f"{seg.label} changed at character {at - seg.char_start}"
    else:
        where = f"prompt changed at character {at}"
    where = f"{where} (now: {snippet(text, at)!r}"
    if exact:  # the baseline may be another user's prompt (a shared session): never quoted
        where = f"{where}; {_baseline_digest(prev.text or '', at)}"
    return at, exact, where + ")"


def _baseline_digest(text: str, at: int) -> str:
    """The baseline's side of a difference without its text: an offset and a hash to compare."""
    piece = text[at : at + SNIPPET]
    digest = hashlib.sha256(piece.encode()).hexdigest()[:16]
    return f"baseline from character {at}: {len(piece)} characters with sha256 {digest}"


def snippet(text: str, at: int) -> str:
    start = max(0, at - SNIPPET)
    end = min(len(text), at + SNIPPET)
    return ("…" if start else "") + text[start:at] + "‸" + text[at:end] + ("…" if end < len(text) else "")


def _pick(changes: list[Change], at: int) -> Change | None:
    """The change whose region holds character ``at`` (regions of one prompt do not overlap)."""
    holding = [c for c in changes if c.start <= at < c.end]
    return min(holding, key=lambda c: c.start) if holding else None


def change_at(prev: Prompt, cur: Prompt, lcp: int, where: tuple[int, bool, str], missed: int) -> Diagnosis:
    at, exact, text = where
    pfp, cfp = prev.fp, cur.fp
    if not (pfp.structured and cfp.structured):
        _, fix = fixes.prompt_edit(at, exact)
        detail: dict[str, Any] = {"segment": "prompt", "character": at, "change": "edited"}
        return Diagnosis("messages_changed", missed, lcp, text, fix, detail)
    change = _pick(structural_changes(pfp, cfp, len(cur.text or "")), at)
    if change is None and (reordered := key_order_change(pfp, cfp)) is not None:
        named = f"tool {reordered['tool']!r}" if "tool" in reordered else f"message {reordered['message']}"
        return Diagnosis(
            "tools_changed" if "tool" in reordered else "messages_changed",
            missed,
            lcp,
            f"the JSON keys of {named} were sent in another order; {text}",
            fixes.KEY_ORDER_FIX,
            reordered,
        )
    if change is None:
        settings = changed_settings(pfp, cfp)
        flagged = REWRITE in cfp.notes  # the renderer saw its template change an earlier turn
        if settings and not flagged:
            reason, fix = fixes.settings(settings)
            return Diagnosis(
                "settings_changed", missed, lcp, f"{reason}; {text}", fix, {"settings": settings}
            )
        # the earlier turn as the baseline rendered it (characters before ``at`` are the same in both)
        seg = next((g for g in (*pfp.segments, *cfp.segments) if g.char_start <= at < g.char_end), None)
        seg = seg or pfp.segment_at_token(lcp) or cfp.segment_at_token(lcp)
        detail = {
            "segment": seg.label if seg else None,
            "character": max(0, at - seg.char_start) if seg else at,
        }
        if flagged:
            detail["renderer"] = [n for n in cfp.notes if n != REWRITE]
        return Diagnosis(
            "template_rewrote_history",
            missed,
            lcp,
            f"{fixes.REWRITE_REASON}; {text}",
            fixes.REWRITE_FIX,
            detail,
        )
    detail = dict(change.detail)
    seg_start = detail.pop("segment_start", change.start)
    if change.type == "system_changed":
        detail["character"] = max(0, at - seg_start)
        fix = fixes.system(detail["character"], exact)
    elif change.type == "tools_changed":
        fix = fixes.tools(detail)
        text = f"{fixes.tools_summary(detail)}; {text}"
    else:
        if detail["change"] == "edited" and at >= seg_start:
            detail["character"] = at - seg_start
        fix = fixes.messages(detail, exact)
    return Diagnosis(change.type, missed, lcp, text, fix, detail)
