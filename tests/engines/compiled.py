"""What chat hands an engine for a tool request: the spec compiled by a ``Compiler`` over the
engine's tokenizer, logits width and end ids (``ChatService.compiler`` does the same)."""

from __future__ import annotations

from server.constrain.compiler import Compiler
from server.constrain.constraint import Constraint
from server.constrain.spec import ToolSpec
from server.engines.base import Engine


def compiled(engine: Engine, spec: ToolSpec) -> Constraint:
    return Compiler(engine.tokenizer, engine.vocab_size, engine.eos_token_ids).compile(spec)
