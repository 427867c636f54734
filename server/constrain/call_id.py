"""What a model writes between a call's name and its arguments: an id (Mistral v11's ``[CALL_ID]``)
or a fixed literal holding special tokens (Harmony's `` <|constrain|>json<|message|>``).

Mistral tokenizer v11 writes a call as ``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}``: the name
ends with the special token ``[CALL_ID]`` (the name trie's ``term_token``), then come the id
(9 letters or digits, mistral-common's rule), the special token ``[ARGS]`` and the arguments.
The arguments grammar never holds special tokens, so the id and ``[ARGS]`` are masked here,
before it:

* ``CallIdMasks`` (per vocabulary and envelope, built once by ``EnvelopeMasks``): the id's
  alphabet and length, read off the envelope's ``call_id`` regex (a fixed-length character
  class, ``[a-zA-Z0-9]{9}``), one packed row per count of id characters still to write
  (the tokens made only of the alphabet and no longer than that count), and the id of the
  special token that follows the id;
* ``IdThenArgs`` wraps a tool's compiled arguments grammar; its ``matcher()`` is an
  ``IdThenArgsMatcher``: the id, exactly its length, then the special token, then the
  arguments matcher. ``takes_special`` tells the tool constraint that this matcher accepts a
  special token (the arguments phase rejects them otherwise).
* ``LiteralMasks``: a fixed text holding special tokens (the rest of the envelope's ``name_close``
  after the byte that ends the name: Harmony's ``<|constrain|>json<|message|>``), forced as the
  tokenizer encodes it, one token per step, then the arguments matcher.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.constrain.bitmask import write_row
from server.constrain.vocab import TokenVocab

_FIXED_CLASS = re.compile(r"^\[([^\]]+)\]\{(?:(\d+),)?(\d+)\}$")


def id_alphabet(pattern: str) -> tuple[frozenset[int], int, int]:
    """(the bytes an id may hold, its longest length, its shortest) of a regex ``[CLASS]{N}`` or
    ``[CLASS]{M,N}`` (Kimi's running index ``[0-9]{1,4}``), ASCII ranges and chars."""
    m = _FIXED_CLASS.match(pattern)
    if m is None:
        raise ValueError(
            f"a call id between the name and the arguments must be a character class of a bounded "
            f"length such as '[a-zA-Z0-9]{{9}}' or '[0-9]{{1,4}}', not {pattern!r}"
        )
    cls, n = m.group(1), int(m.group(3))
    least = int(m.group(2)) if m.group(2) is not None else n
    chars: set[int] = set()
    i = 0
    while i < len(cls):
        if i + 2 < len(cls) and cls[i + 1] == "-":
            chars.update(range(ord(cls[i]), ord(cls[i + 2]) + 1))
            i += 3
        else:
            chars.add(ord(cls[i]))
            i += 1
    if least < 1 or least > n or any(c > 127 for c in chars):
        raise ValueError(f"call id {pattern!r}: an ASCII class and a length of at least 1")
    return frozenset(chars), n, least


class CallIdMasks:
    """The masks of a model-written id followed by a special token (see the module doc)."""

    def __init__(self, vocab: TokenVocab, pattern: str, after_token: int) -> None:
        self.alphabet, self.length, self.least = id_alphabet(pattern)
        self.after_token = after_token
        self.token_len = np.zeros(vocab.vocab_size, dtype=np.int64)  # 0: not an id piece
        alphabet = bytes(sorted(self.alphabet))
        for tid, tb in enumerate(vocab.token_bytes):
            if tb and not tb.translate(None, alphabet):  # every byte in the alphabet
                self.token_len[tid] = len(tb)
        ids = np.arange(vocab.vocab_size)
        self.by_bytes: dict[bytes, int] = {}  # an id piece's bytes -> a token (a forced id: ``expect``)
        for tid in np.flatnonzero(self.token_len).tolist():
            self.by_bytes.setdefault(vocab.token_bytes[tid], tid)
        self.vocab = vocab
        # rows[k]: k id characters still to write (rows[0]: only the special token); an id of a
        # variable length may end (the special token) once ``least`` characters are written
        self.rows = [vocab.pack([after_token])] + [
            vocab.pack(
                np.concatenate(
                    [
                        ids[(self.token_len > 0) & (self.token_len <= k)],
                        [after_token] if self.length - k >= self.least else [],
                    ]
                ).astype(np.int64)
            )
            for k in range(1, self.length + 1)
        ]

    def wrap(self, compiled: Any, backend: Any) -> IdThenArgs:
        return IdThenArgs(self, compiled, backend)


def args_matcher(compiled: Any, backend: Any) -> Any:
    """A fresh matcher of a tool's compiled arguments: a custom tool's grammar, or the backend's."""
    custom = getattr(compiled, "matcher", None)
    return custom() if custom is not None else backend.matcher(compiled)


@dataclass(eq=False)
class IdThenArgs:
    """A tool's compiled arguments, behind the id gate: ``matcher()`` like a custom grammar's."""

    gate: CallIdMasks
    compiled: Any
    backend: Any

    def matcher(self) -> IdThenArgsMatcher:
        return IdThenArgsMatcher(self.gate, args_matcher(self.compiled, self.backend))


class IdThenArgsMatcher:
    """The id (``left`` characters to go), the special token, then the arguments matcher."""

    takes_special = True

    def __init__(self, gate: CallIdMasks, inner: Any) -> None:
        self.gate, self.inner = gate, inner
        self.left = gate.length
        self.opened = False  # the special token after the id was accepted
        self.want: bytes | None = None  # the id this call must have (``expect``), else any id

    def expect(self, call_id: str) -> None:
        """This call's id is ``call_id`` (Kimi's running index): only its tokens, then the special token."""
        if self.gate.least <= len(call_id) <= self.gate.length:
            self.want = call_id.encode()

    def fill(self, bitmask: Any, index: int) -> None:
        if self.opened:
            self.inner.fill(bitmask, index)
            return
        if self.want is not None:
            rest = self.want[self.gate.length - self.left :]
            ok = [
                self.gate.by_bytes[rest[:n]]
                for n in range(1, len(rest) + 1)
                if rest[:n] in self.gate.by_bytes
            ]
            write_row(bitmask, index, self.gate.vocab.pack(ok or [self.gate.after_token]))
            return
        write_row(bitmask, index, self.gate.rows[self.left])

    def accept_token(self, token_id: int) -> bool:
        if self.opened:
            return bool(self.inner.accept_token(token_id))
        written = self.gate.length - self.left
        if self.want is not None:  # the forced id: its pieces in order, then the special token
            rest = self.want[written:]
            if token_id == self.gate.after_token:
                self.opened = not rest
                return self.opened
            piece = self.gate.vocab.token_bytes[token_id] if 0 <= token_id < len(self.gate.token_len) else b""
            if not piece or not rest.startswith(piece) or not self.gate.token_len[token_id]:
                return False
            self.left -= len(piece)
            return True
        if token_id == self.gate.after_token and written >= self.gate.least:
            self.opened = True
            return True
        if self.left == 0:
            return False
        n = int(self.gate.token_len[token_id]) if 0 <= token_id < len(self.gate.token_len) else 0
        if n == 0 or n > self.left:
            return False
        self.left -= n
        return True

    def accept_bytes(self, data: bytes) -> bool:
        if self.opened:
            return bool(self.inner.accept_bytes(data))
        if not data:
            return True
        if self.want is not None and not self.want[self.gate.length - self.left :].startswith(data):
            return False
        if len(data) > self.left or any(b not in self.gate.alphabet for b in data):
            return False
        self.left -= len(data)
        return True

    def is_terminated(self) -> bool:
        return self.opened and bool(self.inner.is_terminated())


class LiteralMasks:
    """A fixed token sequence between the name and the arguments (see the module doc)."""

    def __init__(self, vocab: TokenVocab, ids: list[int]) -> None:
        self.ids = list(ids)
        self.rows = [vocab.pack([t]) for t in self.ids]

    def wrap(self, compiled: Any, backend: Any) -> LiteralThenArgs:
        return LiteralThenArgs(self, compiled, backend)


@dataclass(eq=False)
class LiteralThenArgs:
    gate: LiteralMasks
    compiled: Any
    backend: Any

    def matcher(self) -> LiteralThenArgsMatcher:
        return LiteralThenArgsMatcher(self.gate, args_matcher(self.compiled, self.backend))


class LiteralThenArgsMatcher:
    """The literal's tokens (``at``: how many are written), then the arguments matcher."""

    takes_special = True

    def __init__(self, gate: LiteralMasks, inner: Any) -> None:
        self.gate, self.inner, self.at = gate, inner, 0

    def fill(self, bitmask: Any, index: int) -> None:
        if self.at >= len(self.gate.ids):
            self.inner.fill(bitmask, index)
            return
        write_row(bitmask, index, self.gate.rows[self.at])

    def accept_token(self, token_id: int) -> bool:
        if self.at >= len(self.gate.ids):
            return bool(self.inner.accept_token(token_id))
        if token_id != self.gate.ids[self.at]:
            return False
        self.at += 1
        return True

    def accept_bytes(self, data: bytes) -> bool:
        if self.at >= len(self.gate.ids):
            return bool(self.inner.accept_bytes(data))
        return not data  # a name's token never runs on into the literal

    def is_terminated(self) -> bool:
        return self.at >= len(self.gate.ids) and bool(self.inner.is_terminated())
