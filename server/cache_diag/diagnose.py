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

from typing import Any

import server.cache_diag.fixes as fixes
from server.cache_diag.changes import (
    NAMESPACE_SETTINGS,
    changed_settings,
)
from server.cache_diag.diagnosis import CACHE_OFF, REWRITE, CacheState, Diagnosis, Prompt
from server.cache_diag.divergence import change_at, locate, snippet
from server.cache_diag.fingerprint import common_prefix, hashed_common_prefix
from server.cache_diag.replies import first_difference


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
    where = locate(prev, cur, lcp) if diverged is not None else None
    if not state.enabled:
        return _none(diverged, CACHE_OFF)
    if not missed:
        return _none(diverged, where[2] if where else None)
    kept = (min(lcp, limit) // g) * g
    change_cost = reusable - kept
    evict_cost = max(0, kept - state.cached_tokens)
    if where is not None and change_cost > 0 and change_cost >= evict_cost:
        return change_at(prev, cur, lcp, where, missed)
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
    now = snippet(text, at)
    who = _who_changed_reply(prev, cur, detail, now)
    if who is not None:
        type_, reason, fix = who
        return Diagnosis(type_, missed, lcp, reason, fix, detail)
    reason = (
        f"{fixes.REWRITE_REASON}: the previous reply was rendered back with other tokens than were "
        f"generated, from its token {token} of {len(prev.reply)} (now: {now!r})"
    )
    return Diagnosis(REWRITE, missed, lcp, reason, fixes.REWRITE_FIX, detail)


def _who_changed_reply(
    prev: Prompt, cur: Prompt, detail: dict[str, Any], now: str
) -> tuple[str, str, str | None] | None:
    """(type, reason, fix) when the client or the server changed the reply (``detail`` gets where);
    None when neither did: the template rewrote it."""
    if prev.returned is None or cur.echoed is None:
        return None
    n_msgs = len(prev.fp.messages)  # the reply is the message right after the previous request's
    diff = first_difference(prev.returned, cur.echoed)
    if diff is not None:
        part, character = diff
        detail.update({"message": n_msgs, "part": part, "part_character": character})
        return "reply_changed", fixes.reply_changed(n_msgs, part, character, now), fixes.REPLY_CHANGED_FIX
    if prev.cut:
        return "reply_cut", fixes.reply_cut(detail["reply_token"], detail["reply_tokens"], now), None
    return None


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
