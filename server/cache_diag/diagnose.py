"""The diagnosis of one request's cache use against a baseline: one reason type per miss.

The baseline is the session's previous prompt (automatic) or a named earlier response
(``cache_compare_with``). What could have been reused is the baseline's conversation (up
to the end of its last message; not its generation prompt), capped by what the engine
ever reuses (it recomputes at least the last token) and rounded down to the engine's
reuse granularity (block size): the partial last block is not a miss. When the prompt
renders the baseline's reply back (it begins with the baseline's whole prompt, generation
prompt included), the reply's tokens (prefill + generated, which the engine keeps) are
reusable too, and a prompt whose tokens differ inside the reply is ``template_rewrote_history``
(``segment: reply``): the history did not render the reply as it was generated.

    reusable = floor(min(baseline core tokens, prompt tokens - 1) / block) * block
    missed   = reusable - cached tokens          (a miss when > 0; 0 when the cache is off)

When the prompts diverge inside the reusable part, the tokens lost after the divergence
are a change (model, settings, system, tools, messages, or the template rewrote an
earlier turn); the reusable tokens before it that were not served are an eviction (or an
expiry, when the session was idle past the engine's retention time). A miss gets the
larger of the two as its type, and all its missed tokens. No baseline: ``first_request``
for a session never seen, ``unavailable`` when its baseline is no longer kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import server.cache_diag.fixes as fixes
from server.cache_diag.changes import (
    NAMESPACE_SETTINGS,
    Change,
    changed_settings,
    key_order_change,
    structural_changes,
)
from server.cache_diag.fingerprint import Fingerprint, common_prefix, hashed_common_prefix

REASON_TYPES = (
    "model_changed",
    "settings_changed",
    "system_changed",
    "tools_changed",
    "messages_changed",
    "template_rewrote_history",
    "evicted",
    "expired",
    "first_request",
    "unavailable",
)
REWRITE = "template_rewrote_history"
SNIPPET = 24  # characters shown on each side of the first difference
CACHE_OFF = "prefix cache is off (prefix_cache.enabled: false): nothing is reused, no miss is counted"


@dataclass(frozen=True)
class Prompt:
    """A prompt as the diagnosis sees it: its fingerprint, plus ids/text/offsets when known."""

    fp: Fingerprint
    ids: Sequence[int] | None = None
    text: str | None = None
    offsets: Sequence[int] | None = None  # start character of each token
    # a baseline's reply: the ids after ``ids`` that the engine kept (prefill + generated), their text
    reply: Sequence[int] = ()
    reply_text: str = ""


@dataclass(frozen=True)
class CacheState:
    cached_tokens: int
    block_size: int  # the engine's reuse granularity
    enabled: bool = True
    tier: str = "kv cache"  # where an evicted block was last held
    retention_s: float | None = None  # blocks older than this are dropped by time (None: no TTL)


@dataclass(frozen=True)
class Diagnosis:
    type: str | None
    missed_tokens: int | None
    diverged_at_token: int | None = None
    reason: str | None = None
    fix: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def no_baseline(cur: Prompt, state: CacheState, seen_before: bool, why: str | None = None) -> Diagnosis:
    if seen_before:
        return Diagnosis(
            "unavailable",
            None,
            reason=why
            or "no previous prompt of this session is kept any more (session table full or expired)",
        )
    return Diagnosis(
        "first_request",
        max(0, cur.fp.n_tokens - state.cached_tokens),
        reason="first request of this session: nothing to reuse yet",
    )


def diagnose(prev: Prompt, cur: Prompt, state: CacheState, idle_s: float | None = None) -> Diagnosis:
    g = max(1, state.block_size)
    pfp, cfp = prev.fp, cur.fp
    core = pfp.core_tokens
    if continues_reply(prev, cur):  # the reply came back: its generated tokens were reusable too
        assert prev.ids is not None and cur.ids is not None
        # the reply's last token was sampled, never run through the model: it has no KV to reuse
        core = len(prev.ids) + len(prev.reply) - 1
        lcp = common_prefix([*prev.ids, *prev.reply], cur.ids)
        if lcp >= len(prev.ids) and lcp < core:
            return _reply_rewritten(prev, cur, state, lcp, core, g, idle_s)
    elif prev.ids is not None and cur.ids is not None:
        lcp = common_prefix(prev.ids, cur.ids)
    else:
        lcp = hashed_common_prefix(pfp, cfp)
    limit = min(core, cfp.n_tokens - 1)
    reusable = (max(0, limit) // g) * g if state.enabled else 0
    missed = max(0, reusable - state.cached_tokens)
    diverged = lcp if lcp < core else None
    if pfp.model != cfp.model:
        return (
            _miss(
                "model_changed",
                missed,
                diverged,
                fixes.model(pfp.model, cfp.model),
                {"before": pfp.model, "now": cfp.model},
            )
            if missed
            else _none(diverged)
        )
    namespace = [s for s in changed_settings(pfp, cfp) if s in NAMESPACE_SETTINGS]
    if namespace and missed:
        return _miss("settings_changed", missed, diverged, fixes.settings(namespace), {"settings": namespace})
    where = _where(prev, cur, lcp) if diverged is not None else None
    if not state.enabled:
        return _none(diverged, CACHE_OFF)
    if not missed:
        return _none(diverged, where[2] if where else None)
    kept = (min(lcp, limit) // g) * g
    change_cost = reusable - kept
    evict_cost = max(0, kept - state.cached_tokens)
    if where is not None and change_cost > 0 and change_cost >= evict_cost:
        return _change(prev, cur, lcp, where, missed)
    return _eviction(state, missed, reusable, idle_s, diverged)


def continues_reply(prev: Prompt, cur: Prompt) -> bool:
    """Does ``cur`` render ``prev``'s reply back (its text begins with ``prev``'s whole prompt,
    generation prompt included)? Then the reply's tokens count as reusable."""
    if not prev.reply or prev.ids is None or cur.ids is None or prev.text is None or cur.text is None:
        return False
    # a request that sends the same history again (a retry, another tool_choice) is no continuation:
    # it stops before where the reply would end, so it is compared with the previous prompt alone
    return cur.text.startswith(prev.text) and len(cur.text) > len(prev.text) + len(prev.reply_text)


def _reply_rewritten(
    prev: Prompt, cur: Prompt, state: CacheState, lcp: int, core: int, g: int, idle_s: float | None
) -> Diagnosis:
    """The prompt renders the previous reply back with other tokens from reply token ``lcp - prompt``
    on: the template (or the client) wrote the reply differently from how it was generated."""
    n_prev = len(prev.ids or ())
    limit = min(core, cur.fp.n_tokens - 1)
    reusable = (max(0, limit) // g) * g if state.enabled else 0
    missed = max(0, reusable - state.cached_tokens)
    if not state.enabled:
        return _none(lcp, CACHE_OFF)
    kept = (min(lcp, limit) // g) * g
    if not missed or reusable - kept < max(0, kept - state.cached_tokens):
        return _eviction(state, missed, reusable, idle_s, lcp) if missed else _none(lcp)
    text = cur.text or ""
    offsets = cur.offsets
    at = offsets[lcp] if offsets is not None and lcp < len(offsets) else len(text)
    token = lcp - n_prev
    detail: dict[str, Any] = {
        "segment": "reply",
        "reply_token": token,
        "reply_tokens": len(prev.reply),
        "character": max(0, at - len(prev.text or "")),
    }
    reason = (
        f"{fixes.REWRITE_REASON}: the previous reply was rendered back with other tokens than were "
        f"generated, from its token {token} of {len(prev.reply)} (now: {_snippet(text, at)!r})"
    )
    return Diagnosis(REWRITE, missed, lcp, reason, fixes.REWRITE_FIX, detail)


def _none(diverged: int | None, reason: str | None = None) -> Diagnosis:
    return Diagnosis(None, 0, diverged, reason)


def _miss(
    type_: str, missed: int, diverged: int | None, fix_reason: tuple[str, str | None], detail: dict[str, Any]
) -> Diagnosis:
    reason, fix = fix_reason
    return Diagnosis(type_, missed, diverged, reason, fix, detail)


def _eviction(
    state: CacheState, missed: int, reusable: int, idle_s: float | None, diverged: int | None
) -> Diagnosis:
    expired = state.retention_s is not None and idle_s is not None and idle_s >= state.retention_s
    detail: dict[str, Any] = {
        "tier": state.tier,
        "idle_seconds": None if idle_s is None else round(idle_s, 3),
        "reusable_tokens": reusable,
        "cached_tokens": state.cached_tokens,
    }
    if expired:
        detail["retention_seconds"] = state.retention_s
        return Diagnosis("expired", missed, diverged, fixes.expired(detail), None, detail)
    return Diagnosis("evicted", missed, diverged, fixes.evicted(detail), None, detail)


def _where(prev: Prompt, cur: Prompt, lcp: int) -> tuple[int, bool, str]:
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
    where = f"{where} (now: {_snippet(text, at)!r}"
    if exact:  # the baseline may be another user's prompt (a shared session): never quoted
        where = f"{where}; {_baseline_digest(prev.text or '', at)}"
    return at, exact, where + ")"


def _baseline_digest(text: str, at: int) -> str:
    """The baseline's side of a difference without its text: an offset and a hash to compare."""
    piece = text[at : at + SNIPPET]
    digest = hashlib.sha256(piece.encode()).hexdigest()[:16]
    return f"baseline from character {at}: {len(piece)} characters with sha256 {digest}"


def _snippet(text: str, at: int) -> str:
    start = max(0, at - SNIPPET)
    end = min(len(text), at + SNIPPET)
    return ("…" if start else "") + text[start:at] + "‸" + text[at:end] + ("…" if end < len(text) else "")


def _pick(changes: list[Change], at: int) -> Change | None:
    """The change whose region holds character ``at`` (regions of one prompt do not overlap)."""
    holding = [c for c in changes if c.start <= at < c.end]
    return min(holding, key=lambda c: c.start) if holding else None


def _change(prev: Prompt, cur: Prompt, lcp: int, where: tuple[int, bool, str], missed: int) -> Diagnosis:
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
