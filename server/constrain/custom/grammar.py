"""Custom tools: the model's free-text ``input`` constrained by the tool's grammar (Lark or regex).

A custom tool (``{"type": "custom", "custom": {"name", "format"}}``, normalised by
``server/custom_tools.py`` into a function tool with one string parameter ``input`` and
the format under ``CUSTOM_KEY``) is called inside the family's own envelope:

* JSON envelopes (``arguments: json``): ``{"input": "<input as a JSON string>"}``. The string is
  written with ``json.dumps(..., ensure_ascii=False)``'s escapes only (canonical: ``\\"``,
  ``\\\\``, ``\\n``/``\\t``/…, ``\\u00XX`` for other control characters, everything else raw),
  so ``json.loads`` gives back exactly the input and the history renders the call unchanged.
* XML envelopes (``xml_parameters``, Qwen3-Coder): ``<parameter=input>\\nINPUT\\n</parameter>\\n``,
  INPUT raw; it may not contain ``\\n</parameter>\\n`` (the parser's end of a value).

The grammar engine is llguidance (``LLMatcher``; its Lark dialect is the one OpenAI's custom
tools use). It runs over the *decoded* input bytes; this module wraps it in a byte-level
transducer (``CustomMatcher``): the envelope literal before the input, the input's encoding
(JSON escapes, or the XML end marker held back until it cannot be one), then the envelope
literal after it (one of several alternatives: ``tails``). The mask per step: llguidance's
mask over the raw tokens is exact for every token whose bytes encode themselves (no quote,
backslash or control byte; no newline in XML); the few others are checked one by one.

Everything here is built from the spec's JSON (the tool dict), so vLLM's processor builds
the same constraint in its engine core.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.constrain.bitmask import write_row
from server.constrain.compile_cache import CompileCache
from server.constrain.errors import ConstraintError
from server.constrain.vocab import TokenVocab
from server.tool_keys import CUSTOM_KEY, INPUT

# canonical JSON string escapes (json.dumps, ensure_ascii=False): escape text -> the byte it stands for
ESCAPES: dict[bytes, bytes] = {
    json.dumps(chr(c), ensure_ascii=False)[1:-1].encode(): bytes([c]) for c in [*range(0x20), 0x22, 0x5C]
}
_COMPILED = CompileCache(256, size=lambda c: 4 * len(c.grammar) + 65536)  # text + the lazy odd-token scans
ESCAPE_PREFIXES = frozenset(e[:k] for e in ESCAPES for k in range(1, len(e)))
XML_END = b"\n</parameter>\n"


def custom_format(tool: dict[str, Any]) -> dict[str, Any] | None:
    """The custom format of a (normalised) tool dict, None for a function tool."""
    fmt = tool.get(CUSTOM_KEY)
    return fmt if isinstance(fmt, dict) else None


def prompt_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools as the prompt shows them: a custom tool's format stays out (its description states it)."""
    return [{k: v for k, v in t.items() if k != CUSTOM_KEY} if CUSTOM_KEY in t else t for t in tools]


NO_FORCING = '%llguidance {"no_forcing": true}\n'


def llg_grammar(fmt: dict[str, Any]) -> str:
    """The llguidance grammar of a normalised format (``{"type": "text"}`` or grammar + syntax).

    ``no_forcing``: llguidance otherwise allows only the canonical token over bytes the grammar
    forces (``***`` but not ``*``); the masks here judge tokens by their bytes (a JSON-escaped
    input is not the raw text llguidance sees), so every token that writes the bytes must pass.
    """
    import llguidance

    if fmt.get("type") == "text" or fmt.get("syntax") == "regex":
        regex = r"(?s:.*)" if fmt.get("type") == "text" else str(fmt.get("definition", ""))
        top = json.loads(llguidance.LLMatcher.grammar_from_regex(regex))
        for g in top.get("grammars", []):
            if isinstance(g.get("lark_grammar"), str):
                g["lark_grammar"] = NO_FORCING + g["lark_grammar"]
        return json.dumps(top)
    return NO_FORCING + str(fmt.get("definition", ""))


def check_format(fmt: dict[str, Any], where: str) -> None:
    """ConstraintError (400, ``param=where``) with the compiler's message when the grammar is bad."""
    import llguidance

    error = llguidance.LLMatcher.validate_grammar(llg_grammar(fmt))
    if error:
        raise ConstraintError(
            f"{where}: the {fmt.get('syntax', 'text')} grammar does not compile: {error.strip()}", param=where
        )


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


_LLG: dict[int, LlgVocab] = {}
_LOCK = threading.Lock()


def llg_vocab(vocab: TokenVocab) -> LlgVocab:
    with _LOCK:
        found = _LLG.get(id(vocab))
        if found is None or found.vocab is not vocab:
            found = _LLG[id(vocab)] = LlgVocab(vocab)
        return found


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


def compile_custom(
    vocab: TokenVocab,
    tool: str,
    fmt: dict[str, Any],
    prefix: str,
    suffix: str,
    style: str,
    tails: tuple[str, ...],
) -> CustomCompiled:
    """The pieces for one custom tool in one envelope (``prefix``/``suffix`` as the arguments backend
    gets them);
    cached per (vocabulary, format, envelope strings)."""
    key = (id(vocab), json.dumps(fmt, sort_keys=True), prefix, suffix, style, tails)
    found: CustomCompiled = _COMPILED.get_or_make(
        key,
        lambda: _compile(vocab, tool, fmt, prefix, suffix, style, tails),
        f"the grammar of custom tool {tool!r}",
    )
    return found


def _compile(
    vocab: TokenVocab,
    tool: str,
    fmt: dict[str, Any],
    prefix: str,
    suffix: str,
    style: str,
    tails: tuple[str, ...],
) -> CustomCompiled:
    if "{call_id}" in suffix:
        raise ConstraintError(
            f"custom tool {tool!r}: this model's envelope has the model write a call id, which custom "
            "tools do not support yet; use a function tool",
            param="tools",
        )
    check_format(fmt, f"tool {tool!r} custom.format")
    if style == "xml_parameters":
        before, close, encoding = prefix + f"<parameter={INPUT}>\n", "", "xml"
    else:
        before, close, encoding = prefix + '{"' + INPUT + '": "', "}", "json"
    ends = tuple(close + suffix + t for t in tails) if tails else (close + suffix,)
    return CustomCompiled(
        llg_vocab(vocab), llg_grammar(fmt), before.encode(), tuple(e.encode() for e in ends), encoding
    )


BEFORE, BODY, AFTER = 0, 1, 2
Scan = tuple[bytes, bytes, int]  # (input bytes, bytes held at the end, bytes used up to the close or -1)


def scan(encoding: str, pending: bytes, data: bytes) -> Scan | None:
    """Decode ``data`` written in the input's encoding after the held bytes ``pending`` (pure).

    None: not a valid encoding (a raw control byte or a non-canonical escape in JSON).
    """
    buf = pending + data
    if encoding == "xml":
        at = buf.find(XML_END)
        if at >= 0:
            return buf[:at], b"", at + len(XML_END) - len(pending)
        keep = _held(buf)
        return buf[: len(buf) - keep], buf[len(buf) - keep :], -1
    raw, i = bytearray(), 0
    while i < len(buf):
        c = buf[i]
        if c == 0x5C:  # backslash: a canonical escape
            for esc, byte in ESCAPES.items():
                if buf.startswith(esc, i):
                    raw += byte
                    i += len(esc)
                    break
            else:
                return (bytes(raw), buf[i:], -1) if buf[i:] in ESCAPE_PREFIXES else None
        elif c == 0x22:  # the closing quote
            return bytes(raw), b"", i + 1 - len(pending)
        elif c < 0x20:
            return None
        else:
            raw.append(c)
            i += 1
    return bytes(raw), b"", -1


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


def _held(buf: bytes) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of the XML end marker."""
    for k in range(min(len(buf), len(XML_END) - 1), 0, -1):
        if XML_END.startswith(buf[-k:]):
            return k
    return 0


def odd_xml_all(vocab: TokenVocab, held: bytes) -> list[int]:
    """Held bytes that cannot be content: only tokens continuing the end marker."""
    rest = XML_END[len(held) :]
    return [t for _, t in vocab.prefixes_of(rest)] + vocab.starting_with(rest)
