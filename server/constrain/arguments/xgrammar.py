"""The ``xgrammar`` arguments backend (the default): a JSON-schema grammar per tool, in the envelope's text.

xgrammar's JSON grammar is narrowed to what the history renders back: strings with only the
escapes ``json.dumps(ensure_ascii=False)`` writes (``canonical_strings``) and numbers in the form
Python writes them (``canonical_numbers``). Qwen3-Coder's XML parameters come from ``xml.py``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from server.constrain.arguments.seam import CachedBackend, CallFrame
from server.constrain.compile_cache import CompileCache
from server.constrain.errors import ConstraintError
from server.constrain.vocab import TokenVocab

# JSON string escapes as json.dumps(ensure_ascii=False) / the templates' tojson write them: \" \\ \b \f \n
# \r \t, \u00XX (lowercase) for the other control characters; everything else raw UTF-8. xgrammar's
# JSON grammar also allows \/ and \uXXXX for any character, which the history never renders back.
_ESCAPE_RULE = re.compile(r"^basic_escape ::= .*$", re.MULTILINE)
_CANONICAL_ESCAPE = 'basic_escape ::= (([\\"\\\\bfnrt]) | ("u00" (("0" [0-7bef]) | ("1" [0-9a-f]))))'


def canonical_strings(xgr: Any, grammar: Any) -> Any:
    """``grammar`` whose JSON strings take only the escapes json.dumps writes (see _CANONICAL_ESCAPE):
    the bytes the model writes are the bytes the history renders (UTF-8, as every family's template)."""
    text = str(grammar)
    if not _ESCAPE_RULE.search(text):
        return grammar  # no free-form JSON string in this schema
    return xgr.Grammar.from_ebnf(_ESCAPE_RULE.sub(lambda _m: _CANONICAL_ESCAPE, text))


# xgrammar's JSON number (``-? int ("." digits+)? ([eE] [+-]? digits+)?``), as its schema converter writes it
_NUMBER_RULE = re.compile(
    r"^basic_number ::= \(\(basic_number_1 basic_number_2 basic_number_3 basic_number_5\)\)$", re.MULTILINE
)
# The numbers the history renders back unchanged: every family's history parses the arguments and
# writes them again as json.dumps does (as the vendors' templates do: ``arguments | tojson``), so a
# number must be the form Python writes for the value it parses to: no exponent, no trailing zero
# in a fraction ("1.5", "1.0", never "1.50" or "1e5"), no "-0" integer. Integers of any size and
# floats in [1e-4, 1e16) with at most 17 significant digits, i.e. what models write, round-trip.
_CANONICAL_NUMBER = (
    'basic_number ::= (("0" basic_number_f) | ("-0" basic_number_f_req)'
    ' | ("-"? [1-9] [0-9]* basic_number_f))\n'
    'basic_number_f ::= ("" | basic_number_f_req)\n'
    'basic_number_f_req ::= (("." "0") | ("." [0-9]* [1-9]))'
)


def canonical_numbers(xgr: Any, grammar: Any) -> Any:
    """``grammar`` whose JSON numbers are written as the history renders them (see _CANONICAL_NUMBER)."""
    text = str(grammar)
    if not _NUMBER_RULE.search(text):
        return grammar  # no number in this schema (or a form this rewrite does not know: left as is)
    return xgr.Grammar.from_ebnf(_NUMBER_RULE.sub(lambda _m: _CANONICAL_NUMBER, text))


class XGrammarMatcher:
    __slots__ = ("matcher", "takes_special")

    def __init__(self, matcher: Any, takes_special: bool = False) -> None:
        self.matcher = matcher
        # the grammar writes some special tokens (an envelope's grammar_tokens): the tool constraint
        # lets them through to accept_token (xgrammar's rows hold no other special token)
        self.takes_special = takes_special

    def fill(self, bitmask: Any, index: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, index)  # opaque tokens are special to xgrammar

    def accept_token(self, token_id: int) -> bool:
        return bool(self.matcher.accept_token(token_id))

    def accept_bytes(self, data: bytes) -> bool:
        return bool(self.matcher.accept_string(data)) if data else True

    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())


XGRAMMAR_CACHE_BYTES = 32 * 2**20  # xgrammar's compiler cache (it is unlimited unless told)


class XGrammarBackend(CachedBackend):
    name = "xgrammar"

    def __init__(
        self,
        vocab: TokenVocab,
        *,
        any_whitespace: bool = False,
        cache_size: int = 512,
        grammar_tokens: dict[int, bytes] | None = None,
    ) -> None:
        """``grammar_tokens``: special token ids the grammars write, with their text (Gemma 4's
        ``<|"|>``): in this backend's vocabulary they are that text, every other special token stays
        opaque (never inside a grammar)."""
        import xgrammar as xgr

        info = vocab.xgr_info
        if info is None:
            raise ValueError("the xgrammar backend needs a vocabulary built with TokenVocab.from_tokenizer")
        self.takes_special = bool(grammar_tokens)
        if grammar_tokens:
            patched = [grammar_tokens.get(i, b) for i, b in enumerate(vocab.token_bytes)]
            info = xgr.TokenizerInfo(
                patched, xgr.VocabType.RAW, vocab_size=vocab.vocab_size, stop_token_ids=info.stop_token_ids
            )
        self.xgr, self.vocab, self.any_whitespace = xgr, vocab, any_whitespace
        # our CompileCache keeps the compiled grammars (in the mask rows' byte budget); xgrammar's
        # own cache (unlimited by default) only holds what a compile reuses, bounded here
        self.compiler = xgr.GrammarCompiler(info, max_threads=2, cache_limit_bytes=XGRAMMAR_CACHE_BYTES)
        self.cache = CompileCache(cache_size, size=lambda compiled: compiled.memory_size_bytes)

    def _compile(self, tool: str, schema: dict[str, Any], frame: CallFrame) -> Any:
        xgr = self.xgr
        try:
            if frame.style == "xml_parameters":
                from server.constrain.arguments.xml import xml_parameters_grammar

                args = xml_parameters_grammar(schema, any_whitespace=self.any_whitespace)
            elif frame.style == "tagged":
                from server.constrain.arguments.tagged import tagged_grammar

                args = tagged_grammar(schema, frame.parameter, frame.suffix, self._json_value)
            elif frame.style == "gemma":
                from server.constrain.arguments.gemma import gemma_arguments_grammar

                args = gemma_arguments_grammar(schema)
            else:
                grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=self.any_whitespace)
                args = canonical_numbers(xgr, canonical_strings(xgr, grammar))
        except Exception as exc:
            raise ConstraintError(
                f"tool {tool!r}: its parameters are not a JSON schema the server can enforce ({exc}); "
                f"fix the schema (an object schema with 'properties') or leave 'parameters' out",
                param="tools",
            ) from exc

        def literal(text: str) -> Any:
            return xgr.Grammar.from_ebnf(f"root ::= {json.dumps(text)}")

        suffix, tails = frame.suffix, frame.tails
        tail: list[Any] = []
        if frame.call_id is not None and "{call_id}" in suffix:  # an id the model writes (Mistral v3)
            before, after = suffix.split("{call_id}", 1)
            tail = [literal(before)] if before else []
            tail.append(xgr.Grammar.from_regex(frame.call_id))
            tail += [literal(after)] if after else []
        elif suffix:
            tail = [literal(suffix)]
        if tails:  # one of these ends the call (Mistral v3: "]" or ", " before the next call)
            tail.append(
                xgr.Grammar.union(*[literal(t) for t in tails]) if len(tails) > 1 else literal(tails[0])
            )
        pieces = ([literal(frame.prefix)] if frame.prefix else []) + [args] + tail
        try:
            return self.compiler.compile_grammar(xgr.Grammar.concat(*pieces) if len(pieces) > 1 else args)
        except RuntimeError as exc:  # xgrammar refuses some schemas only here (e.g. a pattern's FSM)
            raise ConstraintError(
                f"tool {tool!r}: its parameters do not compile to a grammar ({str(exc).strip()[-300:]}); "
                "simplify the schema (its 'pattern's in particular) or leave 'parameters' out",
                param="tools",
            ) from exc

    def _json_value(self, schema: dict[str, Any]) -> Any:
        """A JSON value for ``schema``, its strings and numbers as the history writes them back."""
        grammar = self.xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=self.any_whitespace)
        return canonical_numbers(self.xgr, canonical_strings(self.xgr, grammar))

    def matcher(self, compiled: Any) -> XGrammarMatcher:
        matcher = self.xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        return XGrammarMatcher(matcher, self.takes_special)
