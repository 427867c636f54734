"""The reply's token budget against the context window: max_tokens checked, clamped or refused (400s).

The rule at the edge of the window (issue 36 item 10): a reply needs room. When what the window holds
after the prompt is under the reply floor (``limits.min_reply_tokens``, at most a quarter of the
window) and the request wants more than that, the answer is the window error every agent client
compacts on (``PromptTooLong``: Messages ``prompt is too long``, OpenAI ``context_length_exceeded``),
not a reply clamped to a few tokens, which clients answer with "Continue" until they give up.
A request that asks for no more than what is left is served as asked.
"""

from __future__ import annotations

import logging

from server.chat.sampling import sampling_params
from server.config import Settings
from server.engines.base import Engine, SamplingParams
from server.errors import MaxTokensOverLimit, MaxTokensOverWindow, PromptTooLong
from server.log_budget import REQUEST_LOG
from server.protocol import SamplingFields
from server.response_types import MaxTokensClamped

log = logging.getLogger(__name__)


def reply_floor(settings: Settings, window: int) -> int:
    """The least room a reply is given (``limits.min_reply_tokens``, at most a quarter of the window)."""
    return max(1, min(settings.limits.min_reply_tokens, window // 4))


def fit_sampling(
    req: SamplingFields, prompt_len: int, engine: Engine, settings: Settings
) -> tuple[SamplingParams, MaxTokensClamped | None]:
    """The sampling parameters, and the clamp when max_tokens was lowered to fit the window."""
    window = engine.max_model_len
    room = window - prompt_len
    floor = reply_floor(settings, window)
    what = "messages" if getattr(req, "messages", None) is not None else "prompt"
    asked = req.requested_max_tokens()
    wanted = asked if asked is not None else settings.default_max_tokens
    if room < 1 or (room < floor and wanted > room):
        raise PromptTooLong(prompt_len, window, window - floor, floor, param=what)
    name = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    cap = settings.limits.max_tokens
    if asked is not None and cap is not None and asked > cap:
        raise MaxTokensOverLimit(asked, cap, name, req.model)
    clamped = None
    if asked is not None and asked > room and settings.limits.max_tokens_over_window == "clamp":
        clamped = MaxTokensClamped(requested=asked, granted=room)
        REQUEST_LOG.log(
            log,
            logging.INFO,
            "%s=%d lowered to %d: the prompt holds %d of the %d-token context window "
            "(limits.max_tokens_over_window: clamp)",
            name,
            asked,
            room,
            prompt_len,
            window,
        )
        asked = room
    if asked is not None and asked > room:
        raise MaxTokensOverWindow(prompt_len, asked, window, name, what)
    default = room if req.max_tokens_default == "window" else min(settings.default_max_tokens, room)
    max_tokens = asked if asked is not None else default
    return sampling_params(req, max_tokens, engine), clamped
