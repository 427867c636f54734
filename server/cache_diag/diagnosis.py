"""What a cache diagnosis speaks of: a prompt as seen, the cache's state, and the diagnosis (one
reason type per miss, from ``REASON_TYPES``). The logic is ``diagnose.py``; where two prompts
diverge and what changed there is ``divergence.py``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from server.cache_diag.fingerprint import Fingerprint
from server.cache_diag.replies import Parts

REASON_TYPES = (
    "model_changed",
    "settings_changed",
    "system_changed",
    "tools_changed",
    "messages_changed",
    "template_rewrote_history",
    "reply_changed",
    "reply_cut",
    "evicted",
    "expired",
    "first_request",
    "unavailable",
)
REWRITE = "template_rewrote_history"
CACHE_OFF = "prefix cache is off (prefix_cache.enabled: false): nothing is reused, no miss is counted"


@dataclass(frozen=True)
class Prompt:
    """A prompt as the diagnosis sees it: its fingerprint, plus ids/text/offsets when known."""

    fp: Fingerprint
    ids: Sequence[int] | None = None
    text: str | None = None
    offsets: Sequence[int] | None = None  # start character of each token
    # a baseline's reply: the ids after ``ids`` that the engine kept (prefill + generated), their text
    reply: Sequence[int] = ()
    reply_text: str = ""
    # a baseline's reply as the server returned it (server/cache_diag/replies.py), and whether the
    # server dropped part of what the model wrote (a cut call, a stop string); None: not known
    returned: Parts | None = None
    cut: bool = False
    # this prompt's copy of the baseline's reply, as the client sent it back (None: not known)
    echoed: Parts | None = None


@dataclass(frozen=True)
class CacheState:
    cached_tokens: int
    block_size: int  # the engine's reuse granularity
    enabled: bool = True
    tier: str = "kv cache"  # where an evicted block was last held
    retention_s: float | None = None  # blocks older than this are dropped by time (None: no TTL)


@dataclass(frozen=True)
class Diagnosis:
    type: str | None
    missed_tokens: int | None
    diverged_at_token: int | None = None
    reason: str | None = None
    fix: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
