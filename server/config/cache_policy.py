"""cache: what the server does for a session's cache beyond the prefix cache (server/chat/kept_tools.py)."""

from __future__ import annotations

from pydantic import Field

from server.config.section import Section


class CacheSettings(Section):
    keep_removed_tools: bool = Field(
        True,
        description="A named session's request with fewer tools than its previous turn (Codex's compaction "
        "sends tools: []), or the same tools in another order, renders the previous turn's tool list and "
        "masks the removed tools (no call to them can be written): the prompt stays a prefix of the "
        "previous one and its cache is reused. The response lists them in cache.kept_tools. false: the "
        "tools are rendered as sent (and the cache report names the change tools_changed).",
    )
    kept_tools_sessions: int = Field(
        4096, ge=1, description="Sessions whose previous tool list is remembered (LRU), per worker."
    )
    kept_tools_mb: int = Field(
        32,
        ge=1,
        description="MiB of distinct tool lists remembered for keep_removed_tools (sessions sharing a list "
        "hold it once); past it the least recently used sessions are forgotten (their next removal is "
        "rendered as sent).",
    )
