"""``CostModel``: whether restoring a run of blocks from tier 2 beats recomputing it.

It keeps moving averages of seconds per restored byte and seconds per prefilled token, both
measured, and restores only when that is predicted cheaper (every ``EXPLORE_EVERY``-th refusal
restores anyway, so a changed machine is noticed). ``mode``: auto | always | never.
"""

from __future__ import annotations

EXPLORE_EVERY = 50
_EMA = 0.2


class CostModel:
    """Measured seconds per restored byte vs per prefilled token; ``mode`` auto | always | never."""

    def __init__(self, mode: str = "auto") -> None:
        self.mode = mode
        self.restore_s_per_byte: float | None = None
        self.prefill_s_per_token: float | None = None
        self._refused = 0

    @staticmethod
    def _ema(old: float | None, new: float) -> float:
        return new if old is None else (1 - _EMA) * old + _EMA * new

    def observe_restore(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0:
            self.restore_s_per_byte = self._ema(self.restore_s_per_byte, seconds / nbytes)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self.prefill_s_per_token = self._ema(self.prefill_s_per_token, seconds / tokens)

    def worth_restoring(self, nbytes: int, tokens: int) -> bool:
        if self.mode != "auto":
            return self.mode == "always"
        if self.restore_s_per_byte is None or self.prefill_s_per_token is None:
            return True  # measure first
        if nbytes * self.restore_s_per_byte < tokens * self.prefill_s_per_token:
            return True
        self._refused += 1
        return self._refused % EXPLORE_EVERY == 0
