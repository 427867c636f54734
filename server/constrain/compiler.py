"""``Compiler``: a ``ToolSpec`` → the request's ``Constraint`` (its matcher), where the engine decodes.

The chat service owns one (built from the model's tokenizer, logits width and end ids:
``ChatService``); engines own none. It shares the process's ``TokenVocab`` of that tokenizer
(``vocab_of``) and keeps one ``EnvelopeCompiler`` per (envelope, backend), whose trie and
grammar caches make a second build of the same tools cheap. A request's spec is compiled once
per process where it is used: the chat service compiles it at prepare time (a bad schema or
tool choice is a 400 there) and the engine decodes under that matcher (the hf and llamacpp
engines; the vllm engine's mirror); vLLM's logits processor builds its own in the engine core
(its own compiler, from the spec in ``extra_args``).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from server.constrain.constraint import Constraint
from server.constrain.custom.compile import CustomCompiler
from server.constrain.envelope_compiler import EnvelopeCompiler
from server.constrain.interface import TokenMatcher
from server.constrain.reasoning_matcher import ReasoningMatcher
from server.constrain.response_format import json_text_matcher
from server.constrain.spec import ToolSpec
from server.constrain.tool_matcher import ToolMatcher
from server.constrain.vocab import TokenVocab, vocab_of
from server.families.envelope import load_envelope


class Compiler:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)  # used when a spec carries none
        self._custom: CustomCompiler | None = None
        self._envelopes: dict[tuple[str, str], EnvelopeCompiler] = {}
        self._lock = threading.Lock()

    @property
    def vocab(self) -> TokenVocab:
        """The process's vocabulary of this tokenizer and width (``vocab_of``: built once, shared)."""
        return vocab_of(self.tokenizer, self.vocab_size)

    @property
    def custom(self) -> CustomCompiler:
        """The custom tools' compiler of this vocabulary, shared by every envelope."""
        vocab = self.vocab
        with self._lock:
            if self._custom is None:
                self._custom = CustomCompiler(vocab)
            return self._custom

    def for_envelope(self, envelope: str, backend: str) -> EnvelopeCompiler:
        """The compiler of one (envelope, backend); ValueError for an unknown one (names the known)."""
        key = (envelope, backend)
        found = self._envelopes.get(key)
        if found is None:
            env = load_envelope(envelope)
            found = EnvelopeCompiler(
                self.tokenizer, self.vocab_size, env, backend=backend, vocab=self.vocab, custom=self.custom
            )
            with self._lock:
                found = self._envelopes.setdefault(key, found)
        return found

    def compile(self, spec: ToolSpec) -> Constraint:
        """The request's constraint: the spec and a fresh matcher compiled from it (ValueError or
        a ``GrammarCompileError`` for a spec that cannot be compiled)."""
        return Constraint(spec, self.build(spec))

    def build(self, spec: ToolSpec) -> TokenMatcher | None:
        """The request's constraint (None when the spec has no tools and no text schema: nothing to enforce).

        With ``text_schema`` (response_format) the reply's text must be JSON following it
        (``JsonTextMatcher``); a call may still begin the reply when the plan allows one.
        With reasoning too, the model reasons freely first and the JSON (or the call) follows
        the close tag: the reasoning gate wraps the text constraint as it wraps the tool one.
        """
        eos = tuple(spec.eos_token_ids or self.eos_token_ids)
        compiler = self.for_envelope(spec.envelope, spec.backend)
        built: ToolMatcher | ReasoningMatcher | None
        if spec.text_schema is None:
            return compiler.build(spec.tools, spec.plan, eos, budget=spec.budget)
        # the text schema applies to the answer: after the reasoning closes (the gate wraps it)
        reasoning = spec.plan.reasoning
        built = compiler.build(spec.tools, replace(spec.plan, reasoning=None), eos, budget=spec.budget)
        text: TokenMatcher = json_text_matcher(
            compiler.masks, compiler.backend, spec.text_schema, tuple(sorted(set(eos))), built
        )
        if reasoning is None:
            return text
        return compiler.reasoning(reasoning, text, spec.plan.prefill, eos, answer_inner=True)
