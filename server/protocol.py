"""Request types: OpenAI Chat Completions / Completions shapes plus our extensions.

Unknown top-level fields are ignored (clients send many); wrong types are 400s.
Extensions: ``tool_state_machine``, ``cache_compare_with``. Responses (with the ``cache`` and ``tool_state``
extensions) are built in server/chat/service.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


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


class FunctionCall(_Loose):
    name: str
    arguments: str = "{}"


class ToolCall(_Loose):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(_Loose):
    type: str
    text: str | None = None


class ChatMessage(_Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

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


class SamplingFields(_Loose):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: PromptCacheOptions | None = None  # OpenAI's comparison_response_id
    cache_compare_with: str | None = Field(None, max_length=256)  # extension: a response id

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def comparison_response_id(self) -> str | None:
        """The response to diagnose the cache against (extension spelling first, then OpenAI's)."""
        if self.cache_compare_with:
            return self.cache_compare_with
        return self.prompt_cache_options.comparison_response_id if self.prompt_cache_options else None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    tool_state_machine: str | None = None  # extension: a state machine in grammars/, or "off"


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str]
    echo: bool = False
