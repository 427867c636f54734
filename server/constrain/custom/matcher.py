"""``CustomMatcher``: one custom call's input under its grammar, inside the envelope (a byte transducer).

Phases: BEFORE (the envelope literal before the input), BODY (the input in its encoding, fed to
llguidance as raw bytes), AFTER (one of the envelope literals that close the call). The mask per
step: llguidance's mask over the raw tokens, kept for the tokens that encode themselves, plus the
others checked one by one from a cached decoding (``CustomCompiled.odd_scans``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from server.constrain.bitmask import write_row
from server.constrain.custom.encoding import ESCAPES, XML_END, Scan, scan
from server.constrain.custom.llg_vocab import LlgVocab
from server.constrain.errors import ConstraintError

BEFORE, BODY, AFTER = 0, 1, 2


@dataclass(eq=False)
class CustomCompiled:
    """One custom tool's constraint pieces: envelope text before/after the input, its encoding."""

    llg: LlgVocab
    grammar: str
    before: bytes  # rest of name_close + the input's opening ('{"input": "' or '<parameter=input>\n')
    after: tuple[bytes, ...]  # one of these closes the call (after the closing quote / XML end)
    encoding: str  # "json" | "xml"
    _odd: list[tuple[int, Scan | None]] | None = None

    def matcher(self) -> CustomMatcher:
        return CustomMatcher(self)

    def odd_scans(self) -> list[tuple[int, Scan | None]]:
        """The tokens that do not encode themselves, decoded from a clean state (cached; the
        closers whose rest cannot begin the text after the input are dropped here)."""
        found = self._odd
        if found is None:
            found = []
            for t in self.llg.rows[self.encoding][1]:
                tb = self.llg.vocab.token_bytes[t]
                sc = scan(self.encoding, b"", tb)
                if sc is not None and (sc[2] < 0 or any(e.startswith(tb[sc[2] :]) for e in self.after)):
                    found.append((t, sc))
            self._odd = found
        return found


class CustomMatcher:
    """An ``ArgumentsMatcher`` over ``before + encode(INPUT) + one of after``; INPUT in the grammar."""

    def __init__(self, c: CustomCompiled) -> None:
        import llguidance

        self.c, self.llg = c, c.llg
        self.inner = llguidance.LLMatcher(c.llg.tokenizer, c.grammar, log_level=0)
        if self.inner.is_error():
            raise ConstraintError(f"custom tool grammar: {self.inner.get_error()}", param="tools")
        self.phase, self.pos, self.pending, self.done = BEFORE, 0, b"", False
        self.vocab = c.llg.vocab
        self._row = np.zeros(self.vocab.words, dtype=np.int32)

    # --- ArgumentsMatcher --------------------------------------------------------------------
    def accept_token(self, token_id: int) -> bool:
        tb = self.vocab.token_bytes[token_id] if 0 <= token_id < self.vocab.vocab_size else b""
        return bool(tb) and self._feed(tb, commit=True)

    def accept_bytes(self, data: bytes) -> bool:
        return self._feed(data, commit=True) if data else True

    def is_terminated(self) -> bool:
        return self.done

    def fill(self, bitmask: Any, index: int) -> None:
        write_row(bitmask, index, self._mask())

    @property
    def input_bytes_ok(self) -> bool:
        """Tests: is the inner grammar's matcher free of errors?"""
        return not self.inner.is_error()

    # --- the mask ------------------------------------------------------------------------------
    def _mask(self) -> np.ndarray:
        vocab, row = self.vocab, self._row
        row[:] = 0
        if self.done:
            return row
        if self.phase == BODY and not (self.c.encoding == "json" and self.pending):
            ok = self._body_mask(row)
        else:
            cands: list[int] = []
            if self.phase == BEFORE:
                rest = self.c.before[self.pos :]
                cands = [t for _, t in vocab.prefixes_of(rest)] + vocab.starting_with(rest)
            elif self.phase == AFTER:
                for end in self.c.after:
                    if end.startswith(self.pending):
                        cands += [t for _, t in vocab.prefixes_of(end[len(self.pending) :])]
            else:  # inside a JSON escape: tokens that finish it (and may run on: '")' after '\\')
                return self._escape_mask(row)
            ok = [t for t in dict.fromkeys(cands) if self._feed(vocab.token_bytes[t], commit=False)]
        if ok:
            row |= vocab.pack(ok)
        return row

    def _escape_mask(self, row: np.ndarray) -> np.ndarray:
        """Inside a JSON escape (a token ended on ``\\`` or ``\\u00``): per escape that can finish it,
        the token that completes it, then either ends or runs on with bytes that are a token of their
        own (judged by the inner mask after the escaped byte) or are checked one by one."""
        vocab, ok = self.vocab, list[int]()
        plain = self.llg.rows["json"][0].view(np.uint32)
        inner = np.zeros(vocab.words, dtype=np.int32)
        for esc, byte in ESCAPES.items():
            if not esc.startswith(self.pending) or esc == self.pending:
                continue
            ids = self.llg.ids(byte)
            if ids is None or self.inner.validate_tokens(ids) != 1:
                continue
            self.inner.consume_tokens(ids)
            self.inner.unsafe_compute_mask_ptr(inner.ctypes.data, inner.nbytes)
            bits = inner.view(np.uint32) & plain
            self.inner.rollback(1)
            rest = esc[len(self.pending) :]
            exact, more_tids, more_ids, check = self.llg.escape_table(rest)
            ok += exact
            if more_tids.size:
                hit = (bits[more_ids >> 5] >> (more_ids & 31).astype(np.uint32)) & 1
                ok += more_tids[hit.astype(bool)].tolist()
            first, lead = self.llg.byte_id, self.llg.ids(byte) or []
            for t in check:  # prune on the byte after the escape (plain bytes: the inner mask says)
                more = vocab.token_bytes[t][len(rest) :]
                f = first[more[0]]
                plain_more = not any(c in b'"\\' or c < 0x20 for c in more)
                if plain_more and f is not None and not (int(bits[f >> 5]) >> (f & 31)) & 1:
                    continue
                if plain_more:  # the escaped byte then these bytes, as they are
                    ids = self.llg.ids(more)
                    if ids is not None and self.inner.validate_tokens(lead + ids) == len(ids) + 1:
                        ok.append(t)
                elif self._feed(vocab.token_bytes[t], commit=False):
                    ok.append(t)
            ok += [t for _, t in vocab.prefixes_of(rest) if vocab.token_bytes[t] != rest]  # partial: \u0
        if ok:
            row |= vocab.pack(ok)
        return row

    def _body_mask(self, row: np.ndarray) -> list[int]:
        """Fill ``row`` with the tokens that encode themselves; return the others that pass a check."""
        vocab, held = self.vocab, self.pending  # XML: held bytes may begin the end marker, else content
        ids = self.llg.ids(held)
        if ids is None or self.inner.validate_tokens(ids) != len(ids):  # held bytes must end the input
            rest = XML_END[len(held) :]
            ends = [t for _, t in vocab.prefixes_of(rest)] + vocab.starting_with(rest)
            return [t for t in ends if self._feed(vocab.token_bytes[t], commit=False)]
        if ids:
            self.inner.consume_tokens(ids)
        self.inner.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if ids:
            self.inner.rollback(len(ids))
        bits = (row.view(np.uint32)[self.llg.byte_word] >> self.llg.byte_bit) & 1
        first_ok = (bits.astype(bool) & self.llg.byte_has).tolist()
        plain, odd = self.llg.rows[self.c.encoding]
        row &= plain
        if held:  # a token starting with the marker's next byte may continue the marker: checked below
            extra = vocab.by_first_byte.get(XML_END[len(held)], ())
            row &= ~vocab.pack(extra)
            cands: list[tuple[int, Scan | None]] = [
                (t, scan("xml", held, vocab.token_bytes[t])) for t in (*odd, *extra)
            ]
        else:
            cands = self.c.odd_scans()
        out, memo = [], dict[tuple[bytes, bytes, bool], bool]()  # closers were checked against ``after``
        for t, sc in cands:
            if sc is None:
                continue
            raw = sc[0]
            if raw and not held and not first_ok[raw[0]]:  # (held bytes start ``raw``: no quick check)
                continue
            if (
                len(raw) == 1 and sc[2] < 0 and not sc[1] and not held
            ):  # one input byte: the inner mask said yes
                out.append(t)
                continue
            tb = vocab.token_bytes[t]
            if sc[2] >= 0 and not any(e.startswith(tb[sc[2] :]) for e in self.c.after):
                continue
            key = (raw, sc[1], sc[2] >= 0)
            found = memo.get(key)
            if found is None:
                found = memo[key] = self._check(sc)
            if found:
                out.append(t)
        return out

    def _check(self, sc: Scan) -> bool:
        """Would input bytes with this scan be accepted now (BODY phase; a closer's rest is checked
        by the caller)? No state changes."""
        raw, pend, used = sc
        ids = self.llg.ids(raw)
        if ids is None or (ids and self.inner.validate_tokens(ids) != len(ids)):
            return False
        if used < 0 and not pend:
            return True
        if ids:
            self.inner.consume_tokens(ids)
        try:
            if used >= 0:
                return bool(self.inner.is_accepting())
            return self._pending_viable(pend)
        finally:
            if ids:
                self.inner.rollback(len(ids))

    # --- the transducer ------------------------------------------------------------------------
    def _feed(self, data: bytes, commit: bool) -> bool:
        saved = (self.phase, self.pos, self.pending, self.done)
        consumed = [0]
        ok = self._run(data, consumed)
        if not ok or not commit:
            if consumed[0]:
                self.inner.rollback(consumed[0])
            self.phase, self.pos, self.pending, self.done = saved
        return ok

    def _give(self, raw: bytes, consumed: list[int]) -> bool:
        if not raw:
            return True
        ids = self.llg.ids(raw)
        if ids is None or self.inner.validate_tokens(ids) != len(ids):
            return False
        self.inner.consume_tokens(ids)
        consumed[0] += len(ids)
        return True

    def _run(self, data: bytes, consumed: list[int]) -> bool:
        i = 0
        while i < len(data):
            if self.done:
                return False
            if self.phase == BEFORE:
                rest = self.c.before[self.pos :]
                n = min(len(rest), len(data) - i)
                if data[i : i + n] != rest[:n]:
                    return False
                self.pos += n
                i += n
                if self.pos == len(self.c.before):
                    self.phase = BODY
            elif self.phase == BODY:
                sc = scan(self.c.encoding, self.pending, data[i:])
                if sc is None or not self._give(sc[0], consumed):
                    return False
                if sc[2] < 0:
                    self.pending = sc[1]
                    break
                if not self.inner.is_accepting():
                    return False
                self.phase, self.pending = AFTER, b""
                i += sc[2]
            else:
                text = self.pending + data[i:]
                if not any(e.startswith(text) for e in self.c.after):
                    return False
                self.pending = text
                self.done = text in self.c.after
                break
        if self.phase == BODY and self.pending:
            return self._pending_viable(self.pending)
        return True

    def _pending_viable(self, pending: bytes) -> bool:
        """Held bytes at the end of a token: some way on must exist (an escape's end; XML: content or
        the end)."""
        if self.c.encoding == "json":
            for esc, byte in ESCAPES.items():
                if esc.startswith(pending):
                    ids = self.llg.ids(byte)
                    if ids is not None and self.inner.validate_tokens(ids) == 1:
                        return True
            return False
        if self.inner.is_accepting():
            return True
        ids = self.llg.ids(pending)
        return ids is not None and self.inner.validate_tokens(ids) == len(ids)
