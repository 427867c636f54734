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
