"""Codex's model catalog (``ModelsResponse``), built from what this server serves.

Codex (0.169, 0.171) reads a provider's ``model_catalog_url`` (``GET URL?client_version=X``; the
provider's key as Bearer) and looks its ``model`` up by ``slug``. For a slug it does not find, it
prints "Model metadata for `NAME` not found. Defaulting to fallback metadata" and leaves out its
freeform ``apply_patch`` tool, and it does not know the window. The catalog is
``{"models": [ModelInfo, ...]}``; of ``ModelInfo`` Codex 0.171.0 refuses the whole catalog when any of
``slug``, ``display_name``, ``base_instructions``, ``supported_reasoning_levels``, ``shell_type``,
``visibility``, ``supported_in_api``, ``priority``, ``support_verbosity``, ``truncation_policy``,
``experimental_supported_tools`` is missing (tried one by one against the binary).

Built per served name (aliases too) from the served model's facts:

- ``context_window``: the served window; ``auto_compact_token_limit``: 90 % of it (Codex compacts
  past it, keeping room for a reply; Codex derives the same share when the field is absent);
- ``apply_patch_tool_type: "freeform"``: Codex sends ``apply_patch`` as a custom tool with its Lark
  grammar, which the masks enforce (server/constrain/custom/grammar.py);
- ``truncation_policy``: tool outputs cut to an eighth of the window (at most 10,000 tokens), so a
  small window is not filled by one command's output;
- ``supported_reasoning_levels``: a reasoning family's effort names (its ``efforts`` table, in
  Codex's order), none for a plain family; ``supports_parallel_tool_calls: true``;
- ``base_instructions``: Codex sends them as its first developer message in place of its own
  ~4k-token default (``INSTRUCTIONS`` below, short enough for an 8k window). A user who wants other
  instructions sets Codex's own ``model_instructions_file``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the reasoning efforts Codex knows, in its order (ReasoningEffort in codex-rs; 0.171 adds max/ultra)
CODEX_EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "max", "ultra")
COMPACT_SHARE = 0.9
TRUNCATION_SHARE = 8  # a tool output keeps at most window // 8 tokens
TRUNCATION_MAX = 10_000
INSTRUCTIONS = (
    "You are a coding agent running in the Codex CLI on the user's machine. Work in the current "
    "workspace: read files and run commands with the shell tool, and edit files with the apply_patch "
    "tool (a patch from `*** Begin Patch` to `*** End Patch`). Check your work when you can. Keep "
    "replies short: say what you changed and what is left to do."
)


def reasoning_levels(efforts: Mapping[str, int] | None) -> list[dict[str, str]]:
    """Codex's ``supported_reasoning_levels`` for a family's effort budgets (None: not a reasoning family)."""
    if not efforts:
        return []
    return [
        {"effort": name, "description": f"reason for up to {efforts[name]} tokens"}
        for name in CODEX_EFFORTS
        if name in efforts
    ]


def model_info(slug: str, context_window: int, efforts: Mapping[str, int] | None) -> dict[str, Any]:
    """One ``ModelInfo`` entry of Codex's catalog for the served model under the name ``slug``."""
    levels = reasoning_levels(efforts)
    default = "medium" if any(lv["effort"] == "medium" for lv in levels) else None
    return {
        "slug": slug,
        "display_name": slug,
        "description": f"served by agentserve ({context_window}-token window)",
        **({"default_reasoning_level": default} if default else {}),
        "supported_reasoning_levels": levels,
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": 1,
        "upgrade": None,
        "base_instructions": INSTRUCTIONS,
        "supports_reasoning_summaries": bool(levels),
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform",
        "truncation_policy": {
            "mode": "tokens",
            "limit": min(TRUNCATION_MAX, max(1, context_window // TRUNCATION_SHARE)),
        },
        "supports_parallel_tool_calls": True,
        "context_window": context_window,
        "auto_compact_token_limit": int(context_window * COMPACT_SHARE),
        "experimental_supported_tools": [],
        "input_modalities": ["text"],
    }


def catalog(names: list[str], context_window: int, efforts: Mapping[str, int] | None) -> dict[str, Any]:
    """Codex's ``ModelsResponse``: one entry per served name (unique, non-empty slugs, as Codex checks)."""
    return {"models": [model_info(name, context_window, efforts) for name in dict.fromkeys(names) if name]}
