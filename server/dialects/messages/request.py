"""A Messages request body -> the internal ``ChatCompletionRequest`` + a chat-shaped raw body.

Field by field (docs/api.md "Anthropic Messages"): ``model``, ``max_tokens``, ``temperature``,
``top_p``, ``top_k``, ``stop_sequences``, ``stream``, ``system``/``messages``/``tools``/
``tool_choice`` (``blocks.py``), ``output_config.format`` (a JSON schema: enforced like
``response_format``) and ``thinking`` (a reasoning family: ``budget_tokens`` is the reasoning
budget, ``disabled`` turns it off; the reply's reasoning is a ``thinking`` block) are used.
Accepted and not used:
``output_config.effort``, ``context_management`` (the server never edits the context),
``service_tier``, ``speed``, ``inference_geo``, ``container``, ``metadata`` (its ``user_id`` may name
the session: kept in the raw body for the session key). ``cache_control`` (on system, message and
tool blocks, or top level) places no breakpoint (prefix caching is always on, never rendered): its
longest ``ttl`` (``"5m"``, the default, or ``"1h"``) becomes a retention hint for the session's KV
(``cache_retention_s``: kept at least that long after a reply, up to ``limits.max_retention_s``).
``mcp_servers`` are dropped like server tools. Extensions ``tool_state_machine``,
``cache_compare_with``, ``prompt_cache_key`` and ``seed`` pass through. Other fields: accepted, logged once.
``max_tokens: 0`` is a warm-up (Anthropic's pre-warming): the prompt is prefilled into the prefix cache
(one token is decoded and dropped) and the reply has no content, ``stop_reason: "max_tokens"`` and
``usage`` with ``output_tokens: 0``, so the next request with that prefix reads it from cache.
``max_tokens`` larger than what is left of the context window follows ``limits.max_tokens_over_window``
as in every dialect (default ``clamp``: lowered to fit, as Anthropic's newer models do); a reply that
reaches a lowered limit ends with ``model_context_window_exceeded``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from server.chat.sampling import MAX_FIELD_NAME_LOGGED, MAX_LOGGED_FIELDS
from server.dialects.messages import blocks, ids
from server.errors import InvalidRequest
from server.log_budget import REQUEST_LOG
from server.protocol import ChatCompletionRequest

log = logging.getLogger(__name__)

USED = frozenset(
    {
        "model", "max_tokens", "messages", "system", "tools", "tool_choice", "temperature", "top_p",
        "top_k", "stop_sequences", "stream", "metadata", "diagnostics", "output_config",
        "tool_state_machine", "cache_compare_with", "prompt_cache_key", "cache_control", "thinking",
        "seed",
    }
)  # fmt: skip
ACCEPTED_UNUSED = frozenset(
    {
        "context_management", "service_tier", "speed", "inference_geo", "container",
        "mcp_servers", "user_profile_id", "workspace_id",
    }
)  # fmt: skip
THINKING_TYPES = ("enabled", "adaptive", "disabled")
CACHE_TTL_S = {"5m": 300.0, "1h": 3600.0}  # cache_control ttl → seconds (no ttl: "5m")
_logged: set[str] = set()


class CountTokensBody(BaseModel):
    """``/v1/messages/count_tokens``: what the prompt depends on (no ``max_tokens``)."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    messages: list[Any] = Field(min_length=1)
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    tool_state_machine: str | None = None
    max_tokens: int | None = Field(None, ge=1)


class MessagesBody(CountTokensBody):
    """``/v1/messages``: Anthropic's ranges (temperature 0..1)."""

    max_tokens: int = Field(ge=0)  # required here; 0: a warm-up (the prompt is cached, nothing written)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    cache_compare_with: str | None = Field(None, max_length=256)
    prompt_cache_key: str | None = None
    mcp_servers: list[Any] | None = None


class MessagesChatRequest(ChatCompletionRequest):
    """The chat request of a Messages call (``max_tokens`` follows ``limits.max_tokens_over_window``)."""


@dataclass
class Converted:
    chat: MessagesChatRequest
    raw: dict[str, Any]  # chat-shaped, the client's key order (session key, prefix hash)
    dropped_tools: list[str] = field(default_factory=list)
    diagnostics: bool = False  # the request asked for Anthropic's cache diagnostics
    stop_sequences: list[str] = field(default_factory=list)
    warm_up: bool = False  # max_tokens 0: prefill (cache) the prompt, reply with no tokens


def _check_thinking(thinking: dict[str, Any] | None) -> None:
    if thinking is None:
        return
    kind = thinking.get("type")
    if kind not in THINKING_TYPES:
        raise blocks.bad(
            "thinking.type", f"{kind!r} is not a thinking type: use one of {list(THINKING_TYPES)}"
        )
    budget = thinking.get("budget_tokens")
    if kind == "enabled" and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
        raise blocks.bad(
            "thinking.budget_tokens", 'thinking {"type": "enabled"} needs an integer budget_tokens >= 1'
        )


def _cache_controls(raw_body: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every ``cache_control`` of the request, with where it was (for a 400 that names it)."""
    found = (
        [("cache_control", raw_body["cache_control"])] if raw_body.get("cache_control") is not None else []
    )
    system = raw_body.get("system")
    blocks_at: list[tuple[str, Any]] = (
        [(f"system.{i}", b) for i, b in enumerate(system or [])] if isinstance(system, list) else []
    )
    for i, m in enumerate(raw_body.get("messages") or []):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            blocks_at += [(f"messages.{i}.content.{j}", b) for j, b in enumerate(content)]
    blocks_at += [(f"tools.{i}", t) for i, t in enumerate(raw_body.get("tools") or [])]
    for where, block in blocks_at:
        if isinstance(block, dict) and block.get("cache_control") is not None:
            found.append((f"{where}.cache_control", block["cache_control"]))
    return found


def _retention_s(raw_body: dict[str, Any]) -> float | None:
    """The longest ``cache_control`` ttl in seconds (None: no cache_control at all)."""
    longest = None
    for where, control in _cache_controls(raw_body):
        ttl = control.get("ttl", "5m") if isinstance(control, dict) else None
        if not isinstance(control, dict) or control.get("type") != "ephemeral" or ttl not in CACHE_TTL_S:
            raise blocks.bad(where, 'use {"type": "ephemeral"} with an optional "ttl": "5m" or "1h"')
        longest = max(longest or 0.0, CACHE_TTL_S[ttl])
    return longest


def _response_format(output_config: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (output_config or {}).get("format")
    if fmt is None:
        return None
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        raise blocks.bad("output_config.format", 'use {"type": "json_schema", "schema": {…}}')
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


def _log_unknown(body: BaseModel) -> None:
    """Each unknown field name logged once, cut to ``MAX_FIELD_NAME_LOGGED`` characters, the first
    ``MAX_LOGGED_FIELDS`` names only (as chat's ``check_fields``): a client sending thousands of
    long names wrote them all to the log."""
    for name in body.model_extra or {}:
        short = name[:MAX_FIELD_NAME_LOGGED]
        if name in USED or name in ACCEPTED_UNUSED or short in _logged or len(_logged) >= MAX_LOGGED_FIELDS:
            continue
        _logged.add(short)
        REQUEST_LOG.log(log, logging.INFO, "Messages field %r is not used by this server (accepted)", short)


def convert(body: CountTokensBody, raw_body: dict[str, Any]) -> Converted:
    """The chat request and raw chat-shaped body of a Messages (or count_tokens) request."""
    _check_thinking(body.thinking)
    _log_unknown(body)
    messages = blocks.chat_messages(body.system, body.messages)
    tools, dropped = blocks.chat_tools(body.tools)
    mcp = raw_body.get("mcp_servers")
    if isinstance(mcp, list):
        dropped += [f"{s.get('name', '?') if isinstance(s, dict) else '?'} (mcp_servers)" for s in mcp]
    tool_choice, parallel = blocks.chat_tool_choice(body.tool_choice)
    sampling = {k: raw_body[k] for k in ("temperature", "top_p", "top_k") if raw_body.get(k) is not None}
    stops = list(raw_body.get("stop_sequences") or [])
    passed = ("tool_state_machine", "prompt_cache_key", "seed")  # extensions (seed: as in chat)
    extensions = {k: raw_body[k] for k in passed if raw_body.get(k) not in (None, "")}
    retention = _retention_s(raw_body)
    if retention is not None:
        extensions["cache_retention_s"] = retention
    diagnostics = raw_body.get("diagnostics")
    compare = raw_body.get("cache_compare_with")
    previous = diagnostics.get("previous_message_id") if isinstance(diagnostics, dict) else None
    if not compare and isinstance(previous, str) and previous:
        compare = ids.chat_id(previous)
    thinking = body.thinking or {}
    reasoning: dict[str, Any] = {}
    if thinking.get("type") == "enabled":  # a reasoning family's budget; other families ignore it
        reasoning["max_reasoning_tokens"] = thinking["budget_tokens"]
    elif thinking.get("type") == "disabled":
        reasoning["reasoning_effort"] = "none"
    chat: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        **({"tools": tools} if tools else {}),
        **({"tool_choice": tool_choice} if tool_choice is not None and tools else {}),
        "parallel_tool_calls": parallel,
        "max_tokens": body.max_tokens or 1,  # a warm-up decodes one token, which is not sent
        **sampling,
        **({"stop": stops} if stops else {}),
        "stream": bool(raw_body.get("stream", False)),
        "stream_options": {"include_usage": True},
        **extensions,
        **reasoning,
        **({"cache_compare_with": compare} if compare else {}),
    }
    response_format = _response_format(body.output_config)
    if response_format is not None:
        chat["response_format"] = response_format
    if tool_choice not in (None, "none", "auto") and not tools:
        raise blocks.bad("tool_choice", "tool_choice needs tools: send the tools it may choose from")
    try:
        request = MessagesChatRequest.model_validate(chat)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidRequest(f"invalid request: {where}: {first.get('msg')}", param=where or None) from None
    raw = _raw(raw_body, messages, tools, tool_choice)
    return Converted(request, raw, dropped, diagnostics is not None, stops, body.max_tokens == 0)


def _raw(raw_body: dict[str, Any], messages: list[Any], tools: list[Any], tool_choice: Any) -> dict[str, Any]:
    """The body as a chat request, keys in the client's order (metadata kept for the session key)."""
    out: dict[str, Any] = {}
    for key, value in raw_body.items():
        if key in ("system", "messages"):
            out.setdefault("messages", messages)
        elif key == "tools":
            out["tools"] = tools
        elif key == "tool_choice":
            if tool_choice is not None:
                out["tool_choice"] = tool_choice
        else:
            out[key] = value
    return out
