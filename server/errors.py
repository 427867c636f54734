"""One error hierarchy, mapped once to OpenAI-shaped error JSON (HTTP) and SSE error events.

Every error a client can cause is an ``AgentServeError`` with an HTTP status, an
OpenAI ``type`` and, where useful, the offending ``param`` and a machine ``code``.
Messages say what was wrong and how to fix it.
"""

from __future__ import annotations

from typing import Any


class AgentServeError(Exception):
    status: int = 500
    type: str = "server_error"
    default_code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequest(AgentServeError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    default_code = "context_length_exceeded"


class PromptTooLong(ContextLengthExceeded):
    """The prompt leaves less of the context window than a reply needs (``limit``: the most prompt
    tokens served; the window minus the reply floor). OpenAI's wording, which opencode, Claude Code's
    gateway list and LiteLLM match; Anthropic's (``prompt is too long: N tokens > M maximum``) is
    worded by the Messages dialect from the fields."""

    def __init__(
        self, prompt_tokens: int, window: int, limit: int, floor: int = 0, param: str = "messages"
    ) -> None:
        self.prompt_tokens, self.window, self.limit, self.floor = prompt_tokens, window, limit, floor
        why = (
            f", which leaves {window - prompt_tokens} for the reply, under the {floor}-token minimum "
            f"(limits.min_reply_tokens)"
            if prompt_tokens < window
            else ""
        )
        super().__init__(
            f"This model's maximum context length is {window} tokens. However, your {param} resulted in "
            f"{prompt_tokens} tokens{why}. Please reduce the length of the {param} (nothing was truncated).",
            param=param,
        )


class MaxTokensOverWindow(ContextLengthExceeded):
    """``limits.max_tokens_over_window: reject``: prompt + max_tokens is over the window (OpenAI's
    wording; Anthropic's ``input length and `max_tokens` exceed context limit`` from the fields)."""

    def __init__(self, prompt_tokens: int, max_tokens: int, window: int, name: str, prompt_word: str) -> None:
        self.prompt_tokens, self.max_tokens, self.window = prompt_tokens, max_tokens, window
        room = window - prompt_tokens
        super().__init__(
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {prompt_word}, {max_tokens} in the "
            f"completion). Please reduce the length of the {prompt_word} or completion: {name} at most "
            f"{room} fits (this server refuses rather than lowers it: limits.max_tokens_over_window: reject)",
            param=name,
        )


class MaxTokensOverLimit(InvalidRequest):
    """``max_tokens`` over the operator's cap ``limits.max_tokens`` (the model's output limit, as
    far as clients can tell; Anthropic's ``max_tokens: X > N, which is the maximum allowed …``)."""

    def __init__(self, max_tokens: int, cap: int, name: str, model: str) -> None:
        self.max_tokens, self.cap, self.model = max_tokens, cap, model
        super().__init__(
            f"{name}={max_tokens} is over this server's limit of {cap} (limits.max_tokens): ask for fewer",
            param=name,
        )


class ModelNotFound(InvalidRequest):
    default_code = "model_not_found"


class Unauthorized(AgentServeError):
    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class PayloadTooLarge(AgentServeError):
    status = 413
    type = "invalid_request_error"
    default_code = "request_too_large"


class Timeout(AgentServeError):
    status = 504
    type = "server_error"
    default_code = "timeout"


class NotFound(AgentServeError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class Overloaded(AgentServeError):
    status = 429
    type = "rate_limit_error"
    default_code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int = 1, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class GenerationError(AgentServeError):
    """The engine could not finish a request (e.g. a constraint rejected every token)."""

    status = 500
    type = "server_error"
    default_code = "generation_failed"


class UpstreamUnavailable(AgentServeError):
    """A router found no healthy worker, or a worker died mid-request."""

    status = 503
    type = "server_error"
    default_code = "upstream_unavailable"


class EngineDead(AgentServeError):
    """The worker's engine stopped for good (its thread died): /health and /health/live say 503."""

    status = 503
    type = "server_error"
    default_code = "engine_dead"


def internal_error_body(exc: BaseException) -> dict[str, Any]:
    """Body for an unexpected exception: says what happened without leaking prompt text."""
    return {
        "error": {
            "message": f"internal error ({type(exc).__name__}); the request was not completed",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
