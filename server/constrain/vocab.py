"""A tokenizer's vocabulary as bytes, preprocessed once for every mask built over it.

Masks are computed over the *bytes* each token writes (byte-level BPE's ``Ġ`` is a
space, partial UTF-8 sequences stay partial), so names, literals and the KMP watch
for ``<tool_call>`` all agree with what the detokenizer will print. Special tokens
(``<|im_end|>``, ``<repo_name>``, …) and padding rows past ``len(tokenizer)`` are
*opaque*: they never match text, so they are never part of a name, a literal or
arguments; end-of-sequence ids are allowed explicitly by the phases that end a reply.

The packed mask row (xgrammar's format) is the common currency: int32[ceil(V/32)],
bit j of word i set = token 32*i+j allowed, where V is the logits width.
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


class TokenVocab:
    """Token id → bytes, with indexes for fast prefix lookups. Immutable once built."""

    def __init__(
        self, token_bytes: Sequence[bytes], vocab_size: int, special_ids: Iterable[int] = ()
    ) -> None:
        if vocab_size < len(token_bytes):
            raise ValueError(
                f"vocab_size {vocab_size} is smaller than the tokenizer ({len(token_bytes)} tokens)"
            )
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.special_ids = frozenset(i for i in special_ids if 0 <= i < vocab_size) | frozenset(
            range(len(token_bytes), vocab_size)
        )
        self.token_bytes: list[bytes] = [
            b"" if i in self.special_ids else bytes(token_bytes[i]) for i in range(len(token_bytes))
        ] + [b""] * (vocab_size - len(token_bytes))
        by_bytes: dict[bytes, list[int]] = {}
        for tid, tb in enumerate(self.token_bytes):
            if tb:
                by_bytes.setdefault(tb, []).append(tid)
        self.by_bytes: dict[bytes, tuple[int, ...]] = {k: tuple(v) for k, v in by_bytes.items()}
        self.max_len = max((len(b) for b in self.by_bytes), default=0)
        self._sorted = sorted(self.by_bytes)
        first: dict[int, list[int]] = {}
        for tid, tb in enumerate(self.token_bytes):
            if tb:
                first.setdefault(tb[0], []).append(tid)
        self.by_first_byte: dict[int, tuple[int, ...]] = {k: tuple(v) for k, v in first.items()}
        self.text_ids = np.array([i for i, tb in enumerate(self.token_bytes) if tb], dtype=np.int64)
        self.xgr_info: Any = None  # xgrammar TokenizerInfo over the same bytes (from_tokenizer)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, vocab_size: int | None = None) -> TokenVocab:
        """From a Hugging Face tokenizer; bytes via xgrammar's decoder (handles byte-level BPE)."""
        import xgrammar as xgr

        size = vocab_size or len(tokenizer)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=size)
        special = set(info.special_token_ids) | set(tokenizer.all_special_ids)
        special |= {i for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items() if tok.special}
        vocab = cls(list(info.decoded_vocab)[: len(tokenizer)], size, special)
        # xgrammar's own view of the same bytes: opaque tokens are empty, which xgrammar treats
        # as special (never inside a grammar); from_huggingface alone lets <repo_name> & co.
        # into JSON strings
        eos = [i for i in (tokenizer.eos_token_id,) if i is not None]
        vocab.xgr_info = xgr.TokenizerInfo(
            vocab.token_bytes, xgr.VocabType.RAW, vocab_size=size, stop_token_ids=eos
        )
        return vocab

    @classmethod
    def from_strings(
        cls, tokens: Sequence[str], special_ids: Iterable[int] = (), vocab_size: int | None = None
    ) -> TokenVocab:
        """A hand-made vocabulary (tests): each token's text, UTF-8 encoded."""
        return cls([t.encode() for t in tokens], vocab_size or len(tokens), special_ids)

    # --- packed rows -------------------------------------------------------------------------
    def empty_row(self) -> np.ndarray:
        return np.zeros(self.words, dtype=np.int32)

    def pack(self, ids: Iterable[int] | np.ndarray) -> np.ndarray:
        """A packed int32 row with the given token ids set."""
        ids = np.fromiter(ids, dtype=np.int64) if not isinstance(ids, np.ndarray) else ids.astype(np.int64)
        row = np.zeros(self.words, dtype=np.uint32)
        if ids.size:
            np.bitwise_or.at(row, ids >> 5, (np.uint32(1) << (ids & 31).astype(np.uint32)))
        return row.view(np.int32)

    @staticmethod
    def unpack(row: np.ndarray, vocab_size: int) -> set[int]:
        """The token ids set in a packed row (tests and debugging)."""
        bits = np.unpackbits(np.ascontiguousarray(row).view(np.uint8), bitorder="little")[:vocab_size]
        return set(np.flatnonzero(bits).tolist())

    # --- lookups -----------------------------------------------------------------------------
    def starting_with(self, prefix: bytes) -> list[int]:
        """Ids of the tokens whose bytes start with ``prefix`` (including equal)."""
        out: list[int] = []
        i = self._first_starting(prefix)
        while 0 <= i < len(self._sorted) and self._sorted[i].startswith(prefix):
            out.extend(self.by_bytes[self._sorted[i]])
            i += 1
        return out

    def is_prefix(self, piece: bytes) -> bool:
        """Whether some token's bytes start with ``piece`` (a bisect over the sorted tokens: a set
        of every prefix of every token held ~20 MB on a 128k vocabulary)."""
        return self._first_starting(piece) >= 0

    def prefixes_of(self, text: bytes) -> list[tuple[int, int]]:
        """(length, id) of the tokens that are non-empty prefixes of ``text``."""
        out: list[tuple[int, int]] = []
        at = 0  # text[:n] grows, so its place in the sorted tokens only moves right
        for n in range(1, min(len(text), self.max_len) + 1):
            piece = text[:n]
            at = self._first_starting(piece, at)
            if at < 0:
                break
            for tid in self.by_bytes.get(piece, ()):
                out.append((n, tid))
        return out

    def _first_starting(self, piece: bytes, lo: int = 0) -> int:
        """The index of the first sorted token (from ``lo``) that starts with ``piece``, or -1."""
        i = bisect_left(self._sorted, piece, lo)
        return i if i < len(self._sorted) and self._sorted[i].startswith(piece) else -1

    def describe(self, token_id: int) -> str:
        """A token for error messages: its text, or <special N>."""
        if 0 <= token_id < self.vocab_size and self.token_bytes[token_id]:
            return repr(self.token_bytes[token_id].decode("utf-8", "replace"))
        return f"<special {token_id}>"


_SHARED: weakref.WeakKeyDictionary[Any, dict[int, TokenVocab]] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def vocab_of(tokenizer: Any, vocab_size: int) -> TokenVocab:
    """The vocabulary of ``tokenizer`` at ``vocab_size``, built once per process (a ``TokenVocab``
    is immutable: every compiler over the same tokenizer and width shares it; it goes with the
    tokenizer)."""
    with _SHARED_LOCK:
        found = _SHARED.get(tokenizer, {}).get(vocab_size)
    if found is None:
        built = TokenVocab.from_tokenizer(tokenizer, vocab_size)
        with _SHARED_LOCK:
            found = _SHARED.setdefault(tokenizer, {}).setdefault(vocab_size, built)
    return found
