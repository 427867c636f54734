"""The ``outlines`` arguments backend (config ``grammar_backend: outlines``), on outlines-core.

Same seam as xgrammar (``server/constrain/arguments/seam.py``): one compiled grammar per (schema,
envelope strings), a fresh matcher per call. outlines-core compiles a *regex* into an
index over the vocabulary (a token-level DFA), so:

* the arguments are ``outlines_core.json_schema.build_regex_from_schema`` with its
  whitespace placeholders replaced by ``json.dumps``'s separators (``", "``, ``": "``,
  nothing inside brackets), as the xgrammar backend writes them; ``any_whitespace``
  keeps outlines' own ``[ ]?``;
* the envelope's text around them (rest of name_close, call_end, a model-written call id,
  Mistral v3's ``]`` / ``,``) is regex around that regex;
* the vocabulary is ours (``TokenVocab``: token bytes, special tokens left out), given to
  ``outlines_core.Vocabulary`` directly: no hub download, no tokenizer conversion;
* ``accept_bytes`` (the overflow of a token that finished the name) walks the index one
  byte at a time through the vocabulary's single-byte tokens (byte-level BPE and
  SentencePiece byte fallback have all 256).

Qwen3-Coder's XML parameters have no regex form here: that envelope needs xgrammar (400).
Compiling is slower than xgrammar (a regex DFA over the whole vocabulary, ~1 s per schema
on the embedded 49k vocabulary); cached like xgrammar's (``CompileCache``).
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np

from server.constrain.arguments.seam import CachedBackend, CallFrame
from server.constrain.compile_cache import CompileCache
from server.constrain.errors import ConstraintError
from server.constrain.vocab import TokenVocab

_WS = "\u2063"  # placeholder whitespace handed to build_regex_from_schema, then replaced


# a string's escapes: outlines-core also allows \/, which json.dumps never writes (nor the history)
_ESCAPES, _CANONICAL = '\\\\["\\\\/bfnrt]', '\\\\["\\\\bfnrt]'
# a number: outlines-core also allows "1.50", "1e+5" and "-0", which the history writes differently
# (as json.dumps: server/constrain/arguments/xgrammar.py _CANONICAL_NUMBER)
_NUMBER = "((-)?(0|[1-9][0-9]*))(\\.[0-9]+)?([eE][+-][0-9]+)?"
_CANONICAL_NUMBER = "(0(\\.(0|[0-9]*[1-9]))?|-0\\.(0|[0-9]*[1-9])|(-)?[1-9][0-9]*(\\.(0|[0-9]*[1-9]))?)"
_NUMERIC_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_ENUM_SPAN = 256  # an integer range this small is written as an enum (outlines-core ignores bounds)


def bounded(schema: Any) -> Any:
    """``schema`` with small integer ranges as enums; ValueError for numeric bounds outlines cannot enforce.

    outlines-core 0.2.14's regexes ignore ``minimum`` / ``maximum`` (a bounded integer would
    take any value): rather than enforce less than the schema says, a range of at most 256
    integers becomes an ``enum`` and any other numeric bound is refused.
    """
    if isinstance(schema, list):
        return [bounded(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("enum", "const", "default", "examples") else bounded(v)) for k, v in schema.items()}
    found = [k for k in _NUMERIC_BOUNDS if k in out]
    if not found:
        return out
    lo, hi = out.get("minimum"), out.get("maximum")
    if (
        out.get("type") == "integer"
        and set(found) <= {"minimum", "maximum"}
        and isinstance(lo, int)
        and isinstance(hi, int)
        and 0 <= hi - lo < _ENUM_SPAN
    ):
        rest = {k: v for k, v in out.items() if k not in ("type", "minimum", "maximum")}
        return {**rest, "enum": list(range(lo, hi + 1))}
    raise ValueError(
        f"the outlines backend cannot enforce {', '.join(found)} here (outlines-core ignores numeric bounds; "
        f"only an integer range of at most {_ENUM_SPAN} values is enforced): use grammar_backend xgrammar"
    )


def json_regex(schema: dict[str, Any], any_whitespace: bool = False) -> str:
    """The regex of a JSON value following ``schema``, ``json.dumps`` separators unless any_whitespace."""
    from outlines_core.json_schema import WHITESPACE, build_regex_from_schema

    schema = bounded(schema)
    if any_whitespace:
        rx = str(build_regex_from_schema(json.dumps(schema), WHITESPACE))
        return rx.replace(_ESCAPES, _CANONICAL).replace(_NUMBER, _CANONICAL_NUMBER)
    rx = str(build_regex_from_schema(json.dumps(schema), _WS))
    rx = rx.replace(_ESCAPES, _CANONICAL).replace(_NUMBER, _CANONICAL_NUMBER)
    rx = rx.replace(f"{_WS}:{_WS}", ": ").replace(f"{_WS},{_WS}", ", ").replace(f",{_WS}", ", ")
    return rx.replace(_WS, "")


def regex_literal(text: str) -> str:
    """``text`` as a regex matching exactly it (every non-alphanumeric character as ``\\x{HEX}``)."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}" for c in text)


class OutlinesMatcher:
    __slots__ = ("guide", "single", "eos_word", "eos_bit")

    def __init__(self, guide: Any, single: dict[int, int], eos: int) -> None:
        self.guide, self.single = guide, single
        self.eos_word, self.eos_bit = eos >> 5, np.int32(~np.uint32(1 << (eos & 31)).view(np.int32))

    def fill(self, bitmask: Any, index: int) -> None:
        if isinstance(bitmask, np.ndarray):
            row = bitmask[index]
        elif bitmask.device.type == "cpu":
            row = bitmask.numpy()[index]
        else:  # a device bitmask: write on the host, one copy
            import torch

            host = np.zeros(bitmask.shape[-1], dtype=np.int32)
            self._write(host)
            bitmask[index].copy_(torch.from_numpy(host))
            return
        self._write(row)

    def _write(self, row: np.ndarray) -> None:
        row[:] = 0
        self.guide.write_mask_into(row.ctypes.data, row.size, 4)
        if self.eos_word < row.size:  # outlines' EOS stand-in (a special token) is never allowed here
            row[self.eos_word] &= self.eos_bit

    def accept_token(self, token_id: int) -> bool:
        try:
            self.guide.advance(int(token_id), return_tokens=False)
        except ValueError:
            return False
        return True

    def accept_bytes(self, data: bytes) -> bool:
        for b in data:
            tid = self.single.get(b)
            if tid is None or not self.accept_token(tid):
                return False
        return True

    def is_terminated(self) -> bool:
        return bool(self.guide.is_finished())


class OutlinesBackend(CachedBackend):
    name = "outlines"

    def __init__(
        self,
        vocab: TokenVocab,
        *,
        any_whitespace: bool = False,
        cache_size: int = 512,
        grammar_tokens: dict[int, bytes] | None = None,  # unused: only JSON arguments compile here
    ) -> None:
        try:
            import outlines_core
        except ImportError as exc:  # a dependency of agentserve: only a broken install lacks it
            raise ValueError(
                "grammar_backend 'outlines' needs outlines-core (pip install outlines-core)"
            ) from exc
        self.oc, self.vocab, self.any_whitespace = outlines_core, vocab, any_whitespace
        # outlines-core wants an EOS id outside the map: a special id (never text), masked out of rows
        self.eos = min(vocab.special_ids) if vocab.special_ids else vocab.vocab_size
        self.vocabulary = outlines_core.Vocabulary(
            self.eos, {b: list(ids) for b, ids in vocab.by_bytes.items()}
        )
        self.single = {tb[0]: ids[0] for tb, ids in vocab.by_bytes.items() if len(tb) == 1}
        self.cache = CompileCache(cache_size, size=lambda index: len(pickle.dumps(index)))

    def _compile(self, tool: str, schema: dict[str, Any], frame: CallFrame) -> Any:
        style, suffix, call_id = frame.style, frame.suffix, frame.call_id
        if style != "json":
            raise ConstraintError(
                f"tool {tool!r}: the outlines backend writes JSON arguments only; this model's envelope "
                f"writes {style!r}: set grammar_backend: xgrammar",
                param="tools",
            )
        try:
            args = json_regex(schema, self.any_whitespace)
        except Exception as exc:
            raise ConstraintError(
                f"tool {tool!r}: its parameters are not a JSON schema the outlines backend can enforce "
                f"({exc}); fix the schema or leave 'parameters' out",
                param="tools",
            ) from exc
        if call_id is not None and "{call_id}" in suffix:
            before, after = suffix.split("{call_id}", 1)
            tail = regex_literal(before) + f"(?:{call_id})" + regex_literal(after)
        else:
            tail = regex_literal(suffix)
        if frame.tails:
            tail += "(?:" + "|".join(regex_literal(t) for t in frame.tails) + ")"
        regex = regex_literal(frame.prefix) + f"(?:{args})" + tail
        try:
            return self.oc.Index(regex, self.vocabulary)
        except Exception as exc:
            raise ConstraintError(
                f"tool {tool!r}: the outlines backend cannot compile its parameters ({exc})", param="tools"
            ) from exc

    def matcher(self, compiled: Any) -> OutlinesMatcher:
        return OutlinesMatcher(self.oc.Guide(compiled), self.single, self.eos)
