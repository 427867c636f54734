"""``Prepared``: a request made ready for the engine (the prepare step's result, read by every later step)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from server.cache_diag import Prompt
from server.constrain.compiler import Compiler
from server.constrain.constraint import Constraint
from server.constrain.plan import ToolPlan
from server.constrain.spec import ToolSpec
from server.engines.base import SamplingParams, constraint_errors_as_400
from server.response_types import MaxTokensClamped
from server.session_key import SessionKey


@dataclass
class Prepared:
    kind: str  # "chat" | "text"
    request_id: str
    created: int
    prompt_ids: list[int]
    session_prompt: Prompt
    session: SessionKey
    sampling: SamplingParams
    stops: list[str]
    stream: bool
    include_usage: bool
    prefill: str = ""
    plan: ToolPlan | None = None
    # the request's ToolSpec compiled at prepare time (a fresh matcher): the first generation
    # hands it to the engine (``take_constraint``). None: nothing constrains the reply
    constraint: Constraint | None = None
    cache_salt: str = ""
    call_id_style: Mapping[str, Any] | None = None  # the family's call-id format
    compare_with: str | None = None  # a response id to diagnose the cache against
    tenant: str = ""
    model: str = ""  # the served name the request used (an alias or served_model_name): echoed back
    # max_tokens lowered to fit the window (limits.max_tokens_over_window: clamp): every dialect reports it
    max_tokens_clamped: MaxTokensClamped | None = None
    retain_s: float = 0.0  # the client's retention hint for the session's KV, capped (seconds; 0: none)
    retain_requested_s: float = 0.0  # that hint as the client sent it (limits.max_retention_s caps it)
    retention_unused: str | None = None  # why the engine does not use that hint (None: used, or no hint)
    # the previous turn's tool list was rendered (server/chat/kept_tools.py): the names it keeps in the
    # prompt but masks (empty: only its order was kept); None: the tools were rendered as sent
    kept_tools: list[str] | None = None

    constraint_taken: bool = False

    @property
    def tool_spec(self) -> ToolSpec | None:
        return self.constraint.spec if self.constraint is not None else None

    def take_constraint(self, compiler: Compiler) -> Constraint | None:
        """The constraint of one generation: the one compiled at prepare time, once (a matcher is
        stateful); a later generation of the same request gets the spec compiled anew."""
        c = self.constraint
        if c is None or not self.constraint_taken:
            self.constraint_taken = True
            return c
        with constraint_errors_as_400():
            return compiler.compile(c.spec)
