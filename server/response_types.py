"""Response types: OpenAI Chat Completions / Completions responses and stream chunks, plus our extensions.

Built by server/chat/respond.py (logprob entries by server/chat/generate.py); optional
fields marked ``exclude_if`` are left out of the JSON when unset, as OpenAI leaves them out.
Extensions: ``cache`` (``CacheInfo``: cached tokens and why not more) and ``tool_state``
(``ToolStateInfo``) on a response, ``max_tokens_clamped`` (``MaxTokensClamped``) when max_tokens
was lowered to fit the window, ``incomplete_tool_call`` on a choice cut inside a call.
The request types are in server/protocol.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int  # the reply's tokens up to and including the reasoning's close tag


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails


class CacheInfo(BaseModel):
    """Extension ``cache``: how much of the prompt came from cache, and why not more.

    After ``session_key_source`` come the cache report's fields (``CacheReport.fields()``:
    ``diverged_at_token``, ``reason``, ``type``, ``missed_tokens``, ``fix``, …), kept as sent.
    """

    model_config = ConfigDict(extra="allow")
    cached_tokens: int
    prompt_tokens: int
    session_key_source: str


class ToolStateInfo(BaseModel):
    """Extension ``tool_state``: the tool plan this reply was generated under."""

    mode: str
    allowed: list[str]
    state: str | None


class MaxTokensClamped(BaseModel):
    """Extension ``max_tokens_clamped``: max_tokens was lowered to what the context window holds after
    the prompt (``limits.max_tokens_over_window: clamp``); ``granted`` is what the reply could use."""

    requested: int
    granted: int


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class CustomCallOut(BaseModel):
    name: str
    input: str  # exactly what the model wrote under the tool's grammar


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function", "custom"] = "function"
    function: FunctionCallOut | None = Field(None, exclude_if=lambda v: v is None)
    custom: CustomCallOut | None = Field(None, exclude_if=lambda v: v is None)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = Field(None, exclude_if=lambda v: v is None)
    # a reasoning family's reasoning, under both names clients read (vLLM / DeepSeek, OpenRouter)
    reasoning_content: str | None = Field(None, exclude_if=lambda v: v is None)
    reasoning: str | None = Field(None, exclude_if=lambda v: v is None)


class IncompleteToolCall(BaseModel):
    """Extension: the call a reply was cut inside (finish_reason "length"); never executed-looking."""

    name: str  # the tool name as far as it was written (may itself be cut)
    arguments_so_far: str  # the arguments text as written, unaltered (not valid JSON)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobOut(TopLogprob):
    """One generated token in ``choices[].logprobs.content``: the model's raw log-softmax at it."""

    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobOut] | None
    refusal: list[TokenLogprobOut] | None = None


class CompletionLogprobs(BaseModel):
    """The legacy completions shape (``/v1/completions`` with ``logprobs: N``)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str
    incomplete_tool_call: IncompleteToolCall | None = Field(None, exclude_if=lambda v: v is None)
    stop_reason: str | None = Field(None, exclude_if=lambda v: v is None)  # vLLM's: the stop string matched


class TextChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class ToolCallDelta(ToolCallOut):
    index: int


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = Field(None, exclude_if=lambda v: v is None)
    content: str | None = Field(None, exclude_if=lambda v: v is None)
    tool_calls: list[ToolCallDelta] | None = Field(None, exclude_if=lambda v: v is None)
    reasoning_content: str | None = Field(None, exclude_if=lambda v: v is None)
    reasoning: str | None = Field(None, exclude_if=lambda v: v is None)


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    incomplete_tool_call: IncompleteToolCall | None = Field(None, exclude_if=lambda v: v is None)
    stop_reason: str | None = Field(None, exclude_if=lambda v: v is None)  # vLLM's: the stop string matched


class _Response(BaseModel):
    id: str
    object: str
    created: int
    model: str
    cache: CacheInfo | None = Field(None, exclude_if=lambda v: v is None)
    tool_state: ToolStateInfo | None = Field(None, exclude_if=lambda v: v is None)
    max_tokens_clamped: MaxTokensClamped | None = Field(None, exclude_if=lambda v: v is None)


class ChatCompletionResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class CompletionResponse(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChoice]
    usage: Usage


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = Field(None, exclude_if=lambda v: v is None)


class CompletionChunk(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChoice]
    usage: Usage | None = Field(None, exclude_if=lambda v: v is None)
