"""One-line reasons and fixes per reason type (the wording of the cache report, in one place).

A fix is given for the avoidable types (what the client or the operator can change);
evictions, expiry, first requests and unknown baselines have a reason but no fix.
"""

from __future__ import annotations

from typing import Any

REWRITE_REASON = (
    "the chat template rendered an earlier turn differently although the request kept it unchanged"
)
REWRITE_FIX = (
    "the chat template rewrites earlier turns (e.g. drops earlier reasoning or stamps a date): serve the "
    "model with a family file (model_family) or a template that renders past turns as they were; for a "
    "reasoning family that drops past reasoning or rewrites past calls (gpt-oss's call header), set "
    "keep_reasoning: true to render past turns as the model wrote them (append-only)"
)


REPLY_CHANGED_FIX = (
    "send the assistant's reply back exactly as it was returned (content, reasoning and tool_calls "
    "with their arguments): the cache holds the reply as the model wrote it"
)


def reply_changed(message: int, part: str, character: int, now: str) -> str:
    return (
        f"the previous reply (message {message}) was sent back with other content than the server "
        f"returned: {part} differs from character {character} (now: {now!r})"
    )


def reply_cut(token: int, tokens: int, now: str) -> str:
    return (
        f"the server returned the previous reply without part of what the model wrote (a call cut by "
        f"max_tokens or an interruption, or the stop string that ended it), so the prompt renders the "
        f"reply as returned and the cached reply stops matching at its token {token} of {tokens} "
        f"(now: {now!r}): the rest of the reply is recomputed; nothing to fix on the client"
    )


def model(before: str, now: str) -> tuple[str, str]:
    return (
        f"the model changed from {before!r} to {now!r}: a prefix cache is per model",
        "use one model per session (a separate session key per model)",
    )


def settings(names: list[str]) -> tuple[str, str]:
    joined = ", ".join(names)
    return (
        f"request settings that shape the prompt or the cache namespace changed: {joined}",
        f"keep {joined} fixed for the whole session (or start a new session key when you change it)",
    )


def system(character: int, exact: bool) -> str:
    at = f"character {character}" if exact else f"about character {character}"
    return (
        f"a value that changed since the previous request sits at {at} of the system message: "
        "move it to the end of the prompt or into a user message"
    )


def tools_summary(d: dict[str, Any]) -> str:
    change = d["change"]
    if change in ("added", "removed", "replaced"):
        parts = []
        if d["removed"]:
            parts.append(f"removed {d['removed']}")
        if d["added"]:
            parts.append(f"added {d['added']}")
        return "tool list changed: " + ", ".join(parts)
    if change == "reordered":
        return f"tool list reordered (first moved: {d['tool']!r})"
    return f"definition of tool {d['tool']!r} changed"


def tools(d: dict[str, Any]) -> str:
    change = d["change"]
    if change in ("added", "removed", "replaced"):
        return (
            f"tool {d['tool']!r} was {'removed' if d['removed'] else 'added'}: keep every tool defined "
            "for the whole session and restrict the callable ones with tool_choice allowed_tools or a "
            "tool_state_machine (mask, don't remove)"
        )
    if change == "reordered":
        return "tools were reordered: send them in a stable order"
    return (
        f"the definition of tool {d['tool']!r} changed: keep tool definitions fixed during a session "
        "(no per-request values in descriptions or schemas)"
    )


def messages(d: dict[str, Any], exact: bool) -> str:
    k, change, role = d["message"], d["change"], d.get("role")
    if change == "removed":
        return (
            f"message {k} ({role}) of the previous request was removed: keep the history append-only "
            "(compact by appending a summary, accepting one recompute)"
        )
    if change == "inserted":
        return f"a message ({role}) was inserted at position {k}: append new messages at the end"
    at = d.get("character")
    where = "" if at is None else f" at {'character' if exact else 'about character'} {at}"
    if role == "assistant":
        return (
            f"message {k} (assistant) was edited{where}: send the assistant's reply back exactly as it "
            "was returned (content and tool_calls)"
        )
    return f"message {k} ({role}) was edited{where}: keep earlier messages byte-identical (append only)"


def prompt_edit(at: int, exact: bool) -> tuple[str, str]:
    where = "character" if exact else "about character"
    return (
        f"the prompt changed at {where} {at}",
        f"the prompt changed at {where} {at}: keep the start of the prompt fixed and append new text",
    )


def evicted(d: dict[str, Any]) -> str:
    idle = d.get("idle_seconds")
    after = f" after {idle:.1f} s idle" if idle is not None else ""
    return (
        f"prefix unchanged, but only {d['cached_tokens']} of its {d['reusable_tokens']} reusable tokens were "
        f"still cached: evicted from {d['tier']}{after} (operator: raise prefix_cache.memory_mb, add a "
        "cache tier, or spread sessions over more workers)"
    )


def expired(d: dict[str, Any]) -> str:
    return (
        f"prefix unchanged, but its blocks expired: idle {d['idle_seconds']:.1f} s, past the cache's "
        f"retention of {d['retention_seconds']:.0f} s"
    )


KEY_ORDER_FIX = (
    "send JSON (tool definitions, call arguments) with its keys in the same order every turn: the "
    "prompt shows the client's JSON as sent, as the model's own chat template does; echo a "
    "reply's tool-call arguments back unchanged"
)
