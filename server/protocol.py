"""Request types: OpenAI Chat Completions / Completions request bodies plus our extensions.

Unknown top-level fields are kept in ``model_extra``: those that would change the
output but are not implemented are 400s naming them (``UNSUPPORTED_NEUTRAL``), the rest are
accepted and logged once per name; wrong types and out-of-range values are 400s.
``tool_choice`` is parsed into types at the edge (``server/protocol_tool_choice.py``; a malformed
one is a 400 that lists the accepted forms). Extensions: ``tool_state_machine``,
``cache_compare_with`` and ``cache_retention_s``. The response types are in server/response_types.py.

Retention hints: OpenAI's ``prompt_cache_retention`` (``"in-memory"``: the default policy; ``"24h"``),
``prompt_cache_options.ttl`` and per-content-part ``prompt_cache_breakpoint`` (``"30m"``, ``"12h"``;
``mode`` accepted, no breakpoint placed: every block of the prefix is cached)
and our ``cache_retention_s`` (seconds; what Anthropic's ``cache_control`` ttl becomes) ask the
session-aware KV policy to keep the session's blocks at least that long after a reply
(``retention_hint_s``; capped by ``prefix_cache.session_cap_s``). They never change the prompt.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from server.errors import InvalidRequest
from server.protocol_tool_choice import ToolChoice, parse_tool_choice


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionDef(_Loose):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Loose):
    type: Literal["function"] = "function"
    function: FunctionDef
    custom_format: dict[str, Any] | None = None  # a custom tool's format (server/custom_tools.py)


class FunctionCall(_Loose):
    name: str
    arguments: str = "{}"


class ToolCall(_Loose):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class PromptCacheBreakpoint(_Loose):
    """OpenAI's per-block ``prompt_cache_breakpoint``: no breakpoint is placed here (every block of
    the prefix is cached anyway); its ``ttl`` (or the request's, or 30m) is a retention hint."""

    mode: Literal["explicit"] | None = None
    ttl: Literal["30m", "12h"] | None = None


class ContentPart(_Loose):
    type: str
    text: str | None = None
    prompt_cache_breakpoint: PromptCacheBreakpoint | None = None


class ChatMessage(_Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # an assistant turn's reasoning as our replies return it (either name; vLLM's and OpenRouter's)
    reasoning_content: str | None = None
    reasoning: str | None = None

    def text(self) -> str:
        """The message's text; list content is joined in order (non-text parts are refused earlier)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content)


class StreamOptions(_Loose):
    include_usage: bool = False


class ResponseFormat(_Loose):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict[str, Any] | None = None


class PromptCacheOptions(_Loose):
    comparison_response_id: str | None = Field(None, max_length=256)
    mode: Literal["implicit", "explicit"] | None = None  # accepted: prefix caching is always on
    ttl: Literal["30m", "12h"] | None = None  # a retention hint (PROMPT_CACHE_TTL_S)


# Top-level request fields that would change the output but are not implemented: sent with a
# value other than a neutral one, they are a 400 naming the field (never silently dropped).
# Every other unknown top-level field (metadata, store, service_tier, ...) changes nothing
# here: it is accepted and logged once per field name (``server/chat/sampling.py``).
UNSUPPORTED_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "best_of": (1, None),
    "functions": (None,),  # legacy: send tools
    "function_call": (None,),  # legacy: send tool_choice
    "prediction": (None,),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "web_search_options": (None,),
    "min_tokens": (0, None),  # vLLM extension
    "ignore_eos": (False, None),  # vLLM extension
    "guided_json": (None,),  # vLLM extensions: use tools or response_format
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
}
# Unknown fields accepted without a log line: they never change a reply (OpenAI bookkeeping).
ACCEPTED_QUIETLY = frozenset({"metadata", "store", "service_tier", "safety_identifier"})
RETENTION_S = {"in-memory": 0.0, "in_memory": 0.0, "24h": 86400.0}  # prompt_cache_retention → seconds
PROMPT_CACHE_TTL_S = {"30m": 1800.0, "12h": 43200.0}  # prompt_cache_options / _breakpoint ttl → seconds
MAX_TOP_LOGPROBS = 20  # OpenAI's limit (vLLM's default max_logprobs too)


class SamplingFields(_Loose):
    model_config = ConfigDict(extra="allow")  # unknown fields are kept so the service can judge them
    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    # extension: with no max_tokens, "server" (default) grants default_max_tokens, "window" the rest
    # of the context window (the Responses adapter sets it: OpenAI's unset max_output_tokens)
    max_tokens_default: Literal["server", "window"] = "server"
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: PromptCacheOptions | None = None  # OpenAI's comparison_response_id
    cache_compare_with: str | None = Field(None, max_length=256)  # extension: a response id
    prompt_cache_retention: Literal["in-memory", "in_memory", "24h"] | None = None  # OpenAI's hint
    cache_retention_s: float | None = Field(None, ge=0.0, le=86400.0 * 7)  # extension: a hint, seconds
    # extension, set by the Responses adapter: the prompt_cache_breakpoint of each input text part
    # (their text is joined into one chat message, so the parts' own breakpoints would be lost)
    prompt_cache_breakpoints: list[PromptCacheBreakpoint] | None = Field(None, max_length=4096)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)  # vLLM extension
    logit_bias: dict[str, Any] | None = None  # token id -> bias in [-100, 100] (chat/sampling.py)
    top_k: int | None = Field(None, ge=-1)  # vLLM extension; 0 or -1: off
    min_p: float | None = Field(None, ge=0.0, le=1.0)  # vLLM extension
    stop_token_ids: list[int] | None = None  # vLLM extension

    def unsupported_fields(self) -> list[str]:
        """Sent fields that would change the output but are not implemented (see UNSUPPORTED_NEUTRAL)."""
        extra = self.model_extra or {}
        return [
            k
            for k, neutral in UNSUPPORTED_NEUTRAL.items()
            if k in extra and extra[k] not in neutral and extra[k] != {}
        ]

    def unknown_fields(self) -> list[str]:
        """Sent top-level fields this server neither uses nor refuses (accepted; logged once each)."""
        extra = self.model_extra or {}
        return [k for k in extra if k not in UNSUPPORTED_NEUTRAL and k not in ACCEPTED_QUIETLY]

    def top_logprobs_asked(self) -> int | None:
        """None: no logprobs; N: the chosen token's logprob plus the N most likely (per endpoint)."""
        raise NotImplementedError

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def retention_hint_s(self) -> float:
        """Seconds the client asks the KV policy to keep this session after a reply (0: no hint)."""
        if self.cache_retention_s is not None:
            return self.cache_retention_s
        options_ttl = self.prompt_cache_options.ttl if self.prompt_cache_options else None
        hints = [RETENTION_S.get(self.prompt_cache_retention or "", 0.0)]
        if options_ttl is not None:
            hints.append(PROMPT_CACHE_TTL_S[options_ttl])
        for message in getattr(self, "messages", None) or []:
            parts = message.content if isinstance(message.content, list) else []
            for bp in (p.prompt_cache_breakpoint for p in parts if p.prompt_cache_breakpoint is not None):
                hints.append(PROMPT_CACHE_TTL_S[bp.ttl or options_ttl or "30m"])
        for bp in self.prompt_cache_breakpoints or []:
            hints.append(PROMPT_CACHE_TTL_S[bp.ttl or options_ttl or "30m"])
        return max(hints)

    def comparison_response_id(self) -> str | None:
        """The response to diagnose the cache against (extension spelling first, then OpenAI's)."""
        if self.cache_compare_with:
            return self.cache_compare_with
        return self.prompt_cache_options.comparison_response_id if self.prompt_cache_options else None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    tool_state_machine: str | None = None  # extension: a state machine in grammars/, or "off"
    # reasoning models (a family with ``reasoning``): "none" turns it off; else a budget by effort
    # (checked against the family's effort names only where the family reasons: other families ignore it)
    reasoning_effort: str | None = Field(None, max_length=32)
    max_reasoning_tokens: int | None = Field(None, ge=0)  # extension: the reasoning budget in tokens
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def top_logprobs_asked(self) -> int | None:
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequest(
                "top_logprobs needs logprobs: true (send both, or leave top_logprobs out)",
                param="top_logprobs",
            )
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, value: Any) -> ToolChoice | None:
        return parse_tool_choice(value)  # an InvalidRequest (400, param tool_choice) passes through

    @model_validator(mode="before")
    @classmethod
    def _custom_tools(cls, data: Any) -> Any:
        from server.custom_tools import normalize_request

        return normalize_request(data)  # custom tools, calls and choices in function form


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # legacy: the number of top logprobs

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs
