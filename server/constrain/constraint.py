"""``Constraint``: one request's constraint in the one form an engine receives.

The chat service compiles a request's ``ToolSpec`` once, at prepare time (a bad schema or tool
choice is a 400 there), with its own ``Compiler``; the engine decodes under ``matcher`` and
compiles nothing. ``spec`` travels with it for what runs in another process: vLLM's logits
processor rebuilds the matcher in the engine core from the spec (``ToolSpec.to_extra_args``),
and the vLLM session hold reads whether the turn offered tools.
"""

from __future__ import annotations

from dataclasses import dataclass

from server.constrain.interface import TokenMatcher
from server.constrain.spec import ToolSpec


@dataclass(frozen=True)
class Constraint:
    spec: ToolSpec
    # compiled from ``spec`` in this process: fresh, stateful, for one generation only.
    # None: the spec enforces nothing (no tools, no text schema)
    matcher: TokenMatcher | None
