"""``GET /v1/models`` in Anthropic's Models API shape, for a request that carries ``anthropic-version``.

``{"data": [{"type": "model", "id", "display_name", "created_at", "max_input_tokens", "max_tokens"}],
"has_more": false, "first_id", "last_id"}``: one entry per served name. ``max_input_tokens`` is the
context window and ``max_tokens`` the most a reply may ask (``limits.max_tokens``, else the window),
the two fields Claude Code 2.1.332's model-capabilities schema reads. That Claude Code does not act on
them: its capability fetch is compiled off, and its gateway discovery
(``CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY``) keeps only ``id``/``display_name``/``description`` of
ids containing "claude" or "anthropic", for its model picker. It learns the window from
``CLAUDE_CODE_MAX_CONTEXT_TOKENS`` (configs/clients/claude-code/settings.json).
"""

from __future__ import annotations

from typing import Any

CREATED_AT = "1970-01-01T00:00:00Z"  # no release date for a served model


def anthropic_model(name: str, window: int, max_tokens: int) -> dict[str, Any]:
    return {
        "type": "model",
        "id": name,
        "display_name": name,
        "created_at": CREATED_AT,
        "max_input_tokens": window,
        "max_tokens": max_tokens,
    }


def anthropic_model_list(names: list[str], window: int, max_tokens: int) -> dict[str, Any]:
    return {
        "data": [anthropic_model(n, window, max_tokens) for n in names],
        "has_more": False,
        "first_id": names[0] if names else None,
        "last_id": names[-1] if names else None,
    }
