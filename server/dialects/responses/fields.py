"""Which top-level Responses fields the adapter passes to chat, which it accepts with no effect on
the tokens, and which it refuses unless sent with their neutral value; the bounds on ``metadata`` and
the other echoed strings."""

from __future__ import annotations

from typing import Any

from server.errors import InvalidRequest

PASS_THROUGH = (
    "model",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "prompt_cache_key",
    "prompt_cache_options",
    "prompt_cache_retention",
    "stream",
    "tool_state_machine",
    "cache_compare_with",
    "seed",
    "stop",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
)
# accepted, used by the adapter itself or with no effect on the tokens (see the module docstring)
NO_EFFECT = (
    "store",
    "previous_response_id",
    "metadata",
    "include",
    "client_metadata",
    "service_tier",
    "safety_identifier",
    "truncation",
    "text",
)
REFUSED = {  # would change the output; a 400 unless sent with its neutral value
    "background": (False, None),
    "conversation": (None,),
    "prompt": (None,),
    "max_tool_calls": (None,),
    "top_logprobs": (None, 0),
    "stream_options": (None,),
}


def check_refused(body: dict[str, Any]) -> None:
    for key, neutral in REFUSED.items():
        if key in body and body[key] not in neutral:
            raise InvalidRequest(
                f"{key} is not supported by this server: leave it out (sent: {body[key]!r})", param=key
            )
    truncation = body.get("truncation")
    if truncation not in (None, "disabled", "auto"):
        raise InvalidRequest("truncation must be 'disabled' or 'auto'", param="truncation")


# echoed strings: OpenAI's maxLength 64 for safety_identifier (and what it enforces on prompt_cache_key);
# user: this server's bound (a hashed id fits). Each is echoed in every response object, 3 times a stream.
ECHOED_STRINGS = {"prompt_cache_key": 64, "safety_identifier": 64, "user": 256}


def check_echoed(body: dict[str, Any]) -> None:
    """A 400 for an echoed string over its bound (a 7 MiB prompt_cache_key came back in every answer)."""
    for key, most in ECHOED_STRINGS.items():
        value = body.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > most):
            raise InvalidRequest(
                f"{key} must be a string of at most {most} characters (it is echoed in every response "
                "object): send a shorter one, e.g. a hash of a longer id",
                param=key,
            )


METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's documented limits


def check_metadata(metadata: Any) -> None:
    """OpenAI's bounds on ``metadata`` (echoed in every response object, three times a stream)."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise InvalidRequest("metadata must be an object of string keys and values", param="metadata")
    if len(metadata) > METADATA_PAIRS:
        raise InvalidRequest(f"metadata has {len(metadata)} keys: at most {METADATA_PAIRS}", param="metadata")
    for k, v in metadata.items():
        if len(k) > METADATA_KEY_CHARS or not isinstance(v, str) or len(v) > METADATA_VALUE_CHARS:
            raise InvalidRequest(
                f"metadata: keys are at most {METADATA_KEY_CHARS} characters and values strings of at most "
                f"{METADATA_VALUE_CHARS} (key {k[:64]!r})",
                param="metadata",
            )
