"""The reply's token budget against the context window: max_tokens checked, clamped or refused (400s)."""

from __future__ import annotations

import logging

from server.chat.sampling import sampling_params
from server.config import Settings
from server.engines.base import Engine, SamplingParams
from server.errors import ContextLengthExceeded, InvalidRequest
from server.protocol import SamplingFields
from server.response_types import MaxTokensClamped

log = logging.getLogger(__name__)


def fit_sampling(
    req: SamplingFields, prompt_len: int, engine: Engine, settings: Settings
) -> tuple[SamplingParams, MaxTokensClamped | None]:
    """The sampling parameters, and the clamp when max_tokens was lowered to fit the window."""
    room = engine.max_model_len - prompt_len
    if room < 1:
        raise ContextLengthExceeded(
            f"the prompt is {prompt_len} tokens but the context window is {engine.max_model_len}: "
            f"shorten the conversation (nothing was truncated)",
            param="messages",
        )
    asked = req.requested_max_tokens()
    name = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    cap = settings.limits.max_tokens
    if asked is not None and cap is not None and asked > cap:
        raise InvalidRequest(
            f"{name}={asked} is over this server's limit of {cap} (limits.max_tokens): ask for fewer",
            param=name,
        )
    clamped = None
    if asked is not None and asked > room and settings.limits.max_tokens_over_window == "clamp":
        clamped = MaxTokensClamped(requested=asked, granted=room)
        log.info(
            "%s=%d lowered to %d: the prompt holds %d of the %d-token context window "
            "(limits.max_tokens_over_window: clamp)",
            name,
            asked,
            room,
            prompt_len,
            engine.max_model_len,
        )
        asked = room
    if asked is not None and asked > room:
        raise ContextLengthExceeded(
            f"prompt ({prompt_len} tokens) + {name} ({asked}) exceeds the context window "
            f"({engine.max_model_len}): lower {name} to at most {room} or shorten the prompt "
            f"(this server refuses rather than lowers it: limits.max_tokens_over_window is reject)",
            param=name,
        )
    default = room if req.max_tokens_default == "window" else min(settings.default_max_tokens, room)
    max_tokens = asked if asked is not None else default
    return sampling_params(req, max_tokens, engine), clamped
