"""llguidance's view of a ``TokenVocab``: its tokenizer, the byte tokens, the rows per encoding."""

from __future__ import annotations

import numpy as np

from server.constrain.vocab import TokenVocab


class LlgVocab:
    """llguidance's view of a ``TokenVocab`` (opaque tokens are special), plus per-encoding rows."""

    def __init__(self, vocab: TokenVocab) -> None:
        import llguidance

        self.vocab = vocab
        opaque = [i for i, tb in enumerate(vocab.token_bytes) if not tb]
        tokens = [tb or b"\xff<opaque_%d>" % i for i, tb in enumerate(vocab.token_bytes)]

        class _Wrapper:
            eos_token_id = opaque[0] if opaque else 0
            bos_token_id = None
            special_token_ids = opaque

            def __init__(self) -> None:
                self.tokens = tokens

            def __call__(self, text: bytes | str) -> list[int]:
                data = text.encode() if isinstance(text, str) else text
                return greedy_ids(vocab, data)

        self.tokenizer = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_Wrapper()), n_vocab=vocab.vocab_size
        )
        self.byte_id: list[int | None] = [(vocab.by_bytes.get(bytes([b])) or (None,))[0] for b in range(256)]
        ids = np.array([t if t is not None else 0 for t in self.byte_id], dtype=np.int64)
        self.byte_word, self.byte_bit = ids >> 5, (ids & 31).astype(np.uint32)
        self.byte_has = np.array([t is not None for t in self.byte_id])
        self.rows: dict[str, tuple[np.ndarray, tuple[int, ...]]] = {}
        self._escapes: dict[bytes, tuple[list[int], np.ndarray, np.ndarray, list[int]]] = {}
        for enc, special in (("json", b'"\\'), ("xml", b"\n")):
            plain, odd = list[int](), list[int]()
            for tid, tb in enumerate(vocab.token_bytes):
                if not tb:
                    continue
                if enc == "json" and any(c < 0x20 for c in tb.split(b'"')[0]):
                    continue  # a raw control byte inside the string: never
                (odd if any(c in special for c in tb) else plain).append(tid)
            self.rows[enc] = (vocab.pack(plain), tuple(odd))

    def escape_table(self, rest: bytes) -> tuple[list[int], np.ndarray, np.ndarray, list[int]]:
        """Tokens starting with ``rest`` (the end of an escape): those equal to it, those running on
        with a token's bytes (ids of both, as arrays), and the others (to check one by one)."""
        found = self._escapes.get(rest)
        if found is None:
            exact, tids, more_ids, check = [], [], [], []
            for t in self.vocab.starting_with(rest):
                more = self.vocab.token_bytes[t][len(rest) :]
                r = self.vocab.by_bytes.get(more)
                if not more:
                    exact.append(t)
                elif r is None or any(c in b'"\\' or c < 0x20 for c in more):
                    check.append(t)
                else:
                    tids.append(t)
                    more_ids.append(r[0])
            found = (exact, np.array(tids, dtype=np.int64), np.array(more_ids, dtype=np.int64), check)
            self._escapes[rest] = found
        return found

    def ids(self, data: bytes) -> list[int] | None:
        """``data`` as single-byte tokens (None when a byte has no token of its own)."""
        out = [self.byte_id[b] for b in data]
        return None if None in out else out  # type: ignore[return-value]


def greedy_ids(vocab: TokenVocab, data: bytes) -> list[int]:
    """A greedy longest-match tokenization (llguidance's tokenizer callback; never on the hot path)."""
    out, i = [], 0
    while i < len(data):
        found = vocab.prefixes_of(data[i:])
        if not found:
            i += 1
            continue
        n, tid = found[-1]
        out.append(tid)
        i += n
    return out
