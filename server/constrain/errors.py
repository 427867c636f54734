"""The mask library's one error: a tool list, schema or grammar it cannot compile.

The library imports nothing above itself, so it cannot raise the HTTP layer's
``ConstraintError``; callers (chat, the engines) map a ``ConstraintError`` to an HTTP 400
with the same message and ``param`` (``server/chat/constraint_errors.py``).
"""

from __future__ import annotations


class ConstraintError(ValueError):
    """Bad input to the mask compiler: the message says what and how to fix; ``param`` names the field."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
