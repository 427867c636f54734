"""Errors in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}`` + status code.

The server raises one error hierarchy (``server/errors.py``, OpenAI bodies); on the Messages
paths the app's exception handlers and the stream's error event reshape those bodies here.
"""

from __future__ import annotations

from typing import Any

from server.errors import AgentServeError, MaxTokensOverLimit, MaxTokensOverWindow, PromptTooLong

PATH_PREFIX = "/v1/messages"

# HTTP status -> Anthropic error type (https://docs.anthropic.com/en/api/errors)
STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",  # a method the path does not take
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# our OpenAI error type (or code) -> Anthropic's, for errors that arrive without a status (streams)
OPENAI_TYPES = {
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "rate_limit_error": "rate_limit_error",
    "request_too_large": "request_too_large",
    "timeout": "timeout_error",
    "upstream_unavailable": "overloaded_error",
}


def is_messages_path(path: str) -> bool:
    return path == PATH_PREFIX or path.startswith(PATH_PREFIX + "/")


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _message(openai_body: dict[str, Any]) -> str:
    err = openai_body.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    return "internal error; the request was not completed"


def from_openai(openai_body: dict[str, Any], status: int | None = None) -> dict[str, Any]:
    """An OpenAI error body (``AgentServeError.body()``) in Anthropic's shape."""
    err = openai_body.get("error") if isinstance(openai_body.get("error"), dict) else {}
    assert isinstance(err, dict)
    kind = None
    if status is not None:
        kind = STATUS_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    else:
        kind = OPENAI_TYPES.get(str(err.get("code"))) or OPENAI_TYPES.get(str(err.get("type")), "api_error")
    return error_body(kind, _message(openai_body))


def anthropic_message(exc: AgentServeError | None) -> str | None:
    """Anthropic's own wording of a window / max_tokens error, which Claude Code acts on (2.1.332):
    ``prompt is too long`` -> it compacts; ``input length and `max_tokens` exceed context limit: I + M >
    L`` -> it resends with max_tokens L - I - 1000 (when that is >= 3000); ``max_tokens: X > N, which
    is the maximum allowed number of output tokens for MODEL`` (matched whole) -> it resends at N."""
    if isinstance(exc, PromptTooLong):
        return f"prompt is too long: {exc.prompt_tokens} tokens > {exc.limit} maximum"
    if isinstance(exc, MaxTokensOverWindow):
        return (
            f"input length and `max_tokens` exceed context limit: {exc.prompt_tokens} + {exc.max_tokens} > "
            f"{exc.window}, decrease input length or `max_tokens` and try again"
        )
    if isinstance(exc, MaxTokensOverLimit):
        return (
            f"max_tokens: {exc.max_tokens} > {exc.cap}, which is the maximum allowed number of output "
            f"tokens for {exc.model}"
        )
    return None


def shape_error(
    path: str, status: int, openai_body: dict[str, Any], exc: AgentServeError | None = None
) -> dict[str, Any]:
    """The error body for ``path``: Anthropic's on the Messages paths (in Anthropic's words where it has
    its own, ``anthropic_message``), else the OpenAI body unchanged."""
    if not is_messages_path(path):
        return openai_body
    body = from_openai(openai_body, status)
    own = anthropic_message(exc)
    if own is not None:
        body["error"]["message"] = own
    return body


def stream_error_event(openai_body: dict[str, Any]) -> dict[str, Any]:
    """The SSE ``error`` event for an error after the stream began (``Framing.error_event``)."""
    return from_openai(openai_body)
