"""The decode-time constraint interface every engine drives (no engine or chat import here)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class TokenMatcher(Protocol):
    """Per-request decode-time constraint.

    The bitmask is xgrammar's format: int32 tensor [batch, ceil(vocab/32)], bit j of word i
    set = token 32*i+j allowed. ``fill_next_token_bitmask`` writes row ``index`` in full.
    ``accept_token`` never raises inside the decode loop: it returns False and sets
    ``error`` when the token is not allowed.
    """

    error: str | None

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None: ...

    def accept_token(self, token_id: int) -> bool: ...

    def is_terminated(self) -> bool: ...
