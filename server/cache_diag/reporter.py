"""The cache report of a request: baseline lookup, diagnosis, cost in time, and bookkeeping.

The service calls ``observe_prefill`` when a request's first token arrives (the engine's
measured prefill rate, an EWMA of uncached prompt tokens per second of time to first
token) and ``report`` when it finishes. The baseline is the response named by
``cache_compare_with`` / ``prompt_cache_options.comparison_response_id`` when the request
names one, else the session's previous prompt. Every finished request becomes the
session's new baseline and is kept (as a fingerprint) under its response id.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from server.cache_diag.baselines import (
    BaselineTable,
    Clock,
    FingerprintStore,
    fingerprint_bytes,
    seq_bytes,
)
from server.cache_diag.diagnose import diagnose, no_baseline
from server.cache_diag.diagnosis import CacheState, Diagnosis, Prompt
from server.cache_diag.replies import Parts

MIN_PREFILL_SAMPLE = 32  # tokens: shorter prefills say more about overhead than about the rate


class PrefillRate:
    """EWMA of prefill tokens per second, from the engine's own requests."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.tokens_per_s: float | None = None
        self._lock = threading.Lock()

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens < MIN_PREFILL_SAMPLE or seconds <= 0:
            return
        rate = tokens / seconds
        with self._lock:
            old = self.tokens_per_s
            self.tokens_per_s = rate if old is None else old + self.alpha * (rate - old)

    def seconds(self, tokens: int | None) -> float | None:
        if not tokens or not self.tokens_per_s:
            return None
        return round(tokens / self.tokens_per_s, 4)


@dataclass(frozen=True)
class CacheReport:
    diagnosis: Diagnosis
    compared_with: str | None  # "session", a response id, or None (no baseline)
    missed_seconds: float | None

    def fields(self) -> dict[str, Any]:
        d = self.diagnosis
        return {
            "diverged_at_token": d.diverged_at_token,
            "reason": d.reason,
            "type": d.type,
            "missed_tokens": d.missed_tokens if d.type else 0,
            "missed_seconds": self.missed_seconds if d.type else None,
            "fix": d.fix,
            "detail": d.detail or None,
            "compared_with": self.compared_with,
        }


@dataclass
class _Baseline:
    prompt: Prompt
    finished_at: float


def _baseline_bytes(b: _Baseline) -> int:
    p = b.prompt
    text = sys.getsizeof(p.text) if p.text is not None else 0
    reply = sys.getsizeof(p.reply_text) + seq_bytes(p.reply)
    reply += sum(64 + len(a) + len(b) for a, b in p.returned or ())
    return fingerprint_bytes(p.fp) + text + seq_bytes(p.ids) + seq_bytes(p.offsets) + reply


class CacheReporter:
    def __init__(
        self,
        *,
        block_size: int,
        enabled: bool = True,
        sessions: int = 4096,
        responses_per_tenant: int = 1024,
        sessions_bytes: int | None = None,
        sessions_bytes_per_tenant: int | None = None,
        responses_bytes_per_tenant: int | None = None,
        ttl_s: float = 3600.0,
        tier: str = "kv cache",
        retention_s: float | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.block_size, self.enabled, self.tier, self.retention_s = block_size, enabled, tier, retention_s
        self.clock = clock
        self.sessions: BaselineTable[_Baseline] = BaselineTable(
            sessions,
            clock=clock,
            max_bytes=sessions_bytes,
            size=_baseline_bytes,
            bytes_per_tenant=sessions_bytes_per_tenant,
        )
        self.responses = FingerprintStore(responses_per_tenant, ttl_s, clock, responses_bytes_per_tenant)
        self.rate = PrefillRate()

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        self.rate.observe(tokens, seconds)

    def report(
        self,
        *,
        session: str,
        tenant: str,
        response_id: str,
        prompt: Prompt,
        cached_tokens: int,
        compare_with: str | None = None,
        block_size: int | None = None,
        reply: Sequence[int] = (),
        reply_text: str = "",
        returned: Parts | None = None,
        cut: bool = False,
    ) -> CacheReport:
        """Diagnose this request, then keep it as its session's baseline and under its response id.

        ``reply``: the token ids the engine kept after the prompt (prefill + generated), and
        ``reply_text`` their text: the next request that renders them back may reuse them.
        ``returned``: the reply as the server returned it (in parts), ``cut``: whether the server
        dropped part of what the model wrote: a miss inside the reply names who changed it."""
        bs = block_size or self.block_size
        state = CacheState(cached_tokens, bs, self.enabled, self.tier, self.retention_s)
        now = self.clock()
        entry, seen = self.sessions.lookup(session)
        if compare_with is not None:
            found = self.responses.get(tenant, compare_with)
            if found is None:
                why = f"response {compare_with!r} is not known here (unknown, expired, or another tenant's)"
                diag = no_baseline(prompt, state, seen_before=True, why=why)
            else:
                diag = diagnose(Prompt(found.value), prompt, state, idle_s=now - found.at)
            compared: str | None = compare_with
        elif entry is not None:
            diag = diagnose(entry.value.prompt, prompt, state, idle_s=now - entry.value.finished_at)
            compared = "session"
        else:
            diag = no_baseline(prompt, state, seen_before=seen)
            compared = None
        kept = prompt
        if reply:
            kept = replace(prompt, reply=reply, reply_text=reply_text, returned=returned, cut=cut)
        self.sessions.put(session, _Baseline(kept, now), tenant)
        self.responses.put(tenant, response_id, prompt.fp)
        return CacheReport(diag, compared, self.rate.seconds(diag.missed_tokens))

    def baseline(self, session: str) -> Prompt | None:
        """The session's previous prompt and reply, while kept (the preparer reuses the reply's ids)."""
        entry, _ = self.sessions.lookup(session)
        return entry.value.prompt if entry is not None else None
