"""prefix_cache: the KV prefix cache and its second tier (hf engine; server/kvcache/)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from server.config.section import Section


class Tier2Settings(Section):
    """Where KV evicted from the prefix cache goes (server/kvcache/tier2.py; the llamacpp engine saves
    an evicted session's whole state there: server/engines/llamacpp/tier2.py)."""

    memory_mb: int = Field(
        0,
        ge=0,
        description="Tier-2 budget in MiB (0 = no second tier). Unset: 0, except on the llamacpp engine: "
        "host RAM, min(8 GiB, a quarter of physical memory) (docs/llamacpp.md).",
    )
    path: str | None = Field(
        None, description="A local folder for tier 2 (CPU engines); unset = host RAM (CUDA engines)."
    )
    restore: Literal["auto", "always", "never"] = Field(
        "auto",
        description="auto = restore a block only when measured cheaper than recomputing it (llamacpp: "
        "whenever tier 2 holds a longer prefix than the pool; never = tier 2 off).",
    )

    def budget_mb(self, engine_default_mb: int) -> int:
        """``memory_mb`` as the deployment set it (0: off), else the engine's own default."""
        return self.memory_mb if "memory_mb" in self.model_fields_set else engine_default_mb


class PrefixCacheSettings(Section):
    enabled: bool = Field(True, description="Serve repeated prompt prefixes from the KV cache.")
    block_size: int = Field(32, ge=1, le=1024, description="Tokens per cache block (hf engine).")
    memory_mb: int = Field(1024, ge=0, description="KV-cache memory budget in MiB; eviction past it.")
    policy: Literal["lru", "session"] = Field(
        "session",
        description="Eviction: lru, or session = keep the blocks of sessions waiting on tools / a person "
        "by expected time to return (server/kvcache/retention.py).",
    )
    session_cap_s: float = Field(
        600.0, gt=0, description="session policy: no idle session holds blocks longer than this."
    )
    tier2: Tier2Settings = Tier2Settings()

    def hint_unused(self, evicted: str) -> str | None:
        """Why a client's retention hint is not used (``Engine.retention_hints``), None when it is:
        only the ``session`` policy reads it. ``evicted``: what the engine's cache evicts."""
        if not self.enabled:
            return "the prefix cache is off (prefix_cache.enabled: false)"
        if self.policy != "session":
            return (
                f"prefix_cache.policy is {self.policy!r}: {evicted} are evicted least recently used "
                "first whatever the hint (prefix_cache.policy: session uses it)"
            )
        return None
