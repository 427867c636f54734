"""limits: every bound on a request, a stream and a process."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from server.config.section import Section


class LimitsSettings(Section):
    max_request_bytes: int = Field(8 * 2**20, ge=1024, description="Largest request body (413 past it).")
    max_tools: int = Field(128, ge=1, description="Most tools in one request.")
    max_tool_schema_bytes: int = Field(32768, ge=64, description="Largest JSON of one tool definition.")
    max_tokens: int | None = Field(None, ge=1, description="Cap on max_tokens (None: the context window).")
    max_tokens_over_window: Literal["clamp", "reject"] = Field(
        "clamp",
        description="A max_tokens / max_completion_tokens / max_output_tokens larger than what the context "
        "window holds after the prompt: clamp = lower it to what remains (the reply ends with "
        "finish_reason 'length' if it gets there; the response carries max_tokens_clamped and the log a "
        "line), reject = a 400 naming the most that fits. A prompt alone over the window is a 400 either "
        "way (never truncated). clamp suits agent clients that send a fixed 32000 (opencode, Claude Code).",
    )
    min_reply_tokens: int = Field(
        256,
        ge=1,
        description="The least room a reply is given, capped at a quarter of the context window: when the "
        "prompt leaves less and the request wants more, the answer is the window error agent clients compact "
        "on (Messages 'prompt is too long: N tokens > M maximum', M = window - this; OpenAI "
        "context_length_exceeded), not a reply clamped to a few tokens. A request asking for no more than "
        "what is left is served.",
    )
    max_schema_bound: int = Field(
        65536,
        ge=1,
        description="Largest lower bound (minLength / minItems / minProperties / minContains) in a tool or "
        "response_format schema: what a call must write out. Upper bounds are not limited (they cost "
        "nothing to compile; Claude Code sends maxLength 524288).",
    )
    max_response_format_schema_bytes: int = Field(
        32768, ge=64, description="Largest JSON of a response_format json_schema."
    )
    max_schema_pattern_cost: int = Field(
        2048,
        ge=1,
        description="Most character positions the regular expressions ('pattern', 'patternProperties') of "
        "one tool or response_format schema expand to, counted before compiling: a bounded repetition "
        "{m,n} multiplies what it repeats by n, nested ones multiply (server/constrain/pattern_cost.py).",
    )
    grammar_compile_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest a request waits for one grammar compile (tool schema, response_format, custom "
        "grammar); past it a 400, and the compile finishes into the cache in the background.",
    )
    mask_cache_mb: int = Field(
        256, ge=1, description="Bytes of packed mask rows cached per process (all tool lists together, LRU)."
    )
    max_stop_sequences: int = Field(
        16,
        ge=1,
        description="Most stop strings in one request (OpenAI allows 4; Anthropic's stop_sequences has no "
        "small limit, so the default leaves room for agent clients).",
    )
    max_stop_chars: int = Field(
        256, ge=1, description="Longest stop string in characters (bounds the per-token stop search)."
    )
    max_stop_token_ids: int = Field(128, ge=1, description="Most entries in stop_token_ids.")
    max_logit_bias: int = Field(300, ge=1, description="Most logit_bias entries (OpenAI's limit, 300).")
    max_messages: int = Field(
        4096,
        ge=1,
        description="Most messages (chat) or input items in one request, checked before rendering.",
    )
    body_timeout_s: float = Field(
        60.0, gt=0, description="Longest time to receive a whole request body (408 past it: slow senders)."
    )
    max_connections: int = Field(
        2048, ge=1, description="Open connections + requests per process (worker or router); 503 past it."
    )
    max_concurrent_requests: int = Field(16, ge=1, description="Requests generating at once per worker.")
    max_queued_requests: int = Field(64, ge=0, description="Requests waiting beyond that; more get 429.")
    tenant_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Most of a process's shared places one tenant (an API key) holds: requests running + "
        "queued, and WebSockets (websocket.max_sockets); past it that tenant gets the 429 / 503. None: 0.5 "
        "where tenants share the process (two or more auth.api_keys, or auth.require_router), else 1.",
    )
    request_timeout_s: float = Field(
        600.0, gt=0, description="A request still running after this ends (504)."
    )
    stream_send_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest one write of a stream may wait for a client that does not read; past it the "
        "stream ends, its engine request is cancelled and its admission slot freed.",
    )
    max_retention_s: float | None = Field(
        None,
        gt=0,
        description="Longest a client's retention hint (cache_control ttl, prompt_cache_retention, "
        "cache_retention_s) keeps a session's KV held, on every engine (the vllm session hold included); "
        "longer hints are cut to it (the response says held_s). None: prefix_cache.session_cap_s (600 s).",
    )
    stream_keepalive_s: float = Field(
        15.0,
        ge=0,
        description="A stream silent this long (prefill, long reasoning) sends a keep-alive: an SSE comment "
        "(chat, Responses) or a ping event (Messages). 0: never.",
    )
