"""A call's end that is a special token (``Envelope.sectioned``: Kimi's ``<|tool_call_end|>``,
DeepSeek's ``<｜tool▁call▁end｜>``), forced right after the arguments.

The arguments grammar never holds special tokens, so such an envelope compiles its grammars with an
empty suffix and ``EndTokens.wrap`` puts this gate behind each: the arguments matcher, then the
end's token ids one by one (``takes_special``: the tool constraint lets this matcher take them).
The section's close or the next call's start come after, in the tool constraint's AFTER phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.constrain.bitmask import write_row
from server.constrain.call_id import args_matcher
from server.constrain.vocab import TokenVocab


class EndTokens:
    """The end's token ids and their one-token rows, once per (vocabulary, envelope)."""

    def __init__(self, vocab: TokenVocab, ids: tuple[int, ...]) -> None:
        self.ids = ids
        self.rows = [vocab.pack([t]) for t in ids]

    def wrap(self, compiled: Any, backend: Any) -> ArgsThenEnd:
        return ArgsThenEnd(self, compiled, backend)


@dataclass(eq=False)
class ArgsThenEnd:
    gate: EndTokens
    compiled: Any
    backend: Any

    def matcher(self) -> ArgsThenEndMatcher:
        return ArgsThenEndMatcher(self.gate, args_matcher(self.compiled, self.backend))


class ArgsThenEndMatcher:
    """The arguments matcher, then the end's tokens (``at``: how many are written)."""

    takes_special = True

    def __init__(self, gate: EndTokens, inner: Any) -> None:
        self.gate, self.inner, self.at = gate, inner, 0

    def fill(self, bitmask: Any, index: int) -> None:
        if self.at == 0 and not self.inner.is_terminated():
            self.inner.fill(bitmask, index)
            return
        write_row(bitmask, index, self.gate.rows[self.at])

    def accept_token(self, token_id: int) -> bool:
        if self.at == 0 and not self.inner.is_terminated():
            return bool(self.inner.accept_token(token_id))
        if self.at >= len(self.gate.ids) or token_id != self.gate.ids[self.at]:
            return False
        self.at += 1
        return True

    def accept_bytes(self, data: bytes) -> bool:
        if self.at == 0 and not self.inner.is_terminated():
            return bool(self.inner.accept_bytes(data))
        return not data

    def is_terminated(self) -> bool:
        return self.at >= len(self.gate.ids)
