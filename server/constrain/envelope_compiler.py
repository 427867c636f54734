"""``EnvelopeCompiler``: per (tokenizer, vocabulary, envelope, backend), compiles each request's matcher.

Request lifecycle: the chat service calls ``plan_tools`` (mode, allowed names, prefill),
appends the prefill after the assistant header, and asks ``EnvelopeCompiler.build``
for a ``ToolMatcher`` (``tool_matcher.py``: the phases, per decode step) that
starts right after the prefill. The compiler holds what is shared between requests, as
instance state: the preprocessed vocabulary, the envelope's masks (``EnvelopeMasks``), the
name tries, the arguments backend's compiled grammars and the custom tools' (``CustomCompiler``).
"""

from __future__ import annotations

from typing import Any

from server.constrain.arguments.backends import make_backend
from server.constrain.arguments.seam import CallFrame, sorted_properties, tool_schema
from server.constrain.call_end import EndTokens
from server.constrain.custom.compile import CustomCompiler
from server.constrain.custom.grammar import custom_format
from server.constrain.envelope_masks import EnvelopeMasks
from server.constrain.interface import TokenMatcher
from server.constrain.min_call import minimal_call_tokens
from server.constrain.plan import ReasoningPlan, ToolPlan, tool_names
from server.constrain.reasoning_matcher import ReasoningMasks, ReasoningMatcher
from server.constrain.tool_matcher import ToolMatcher
from server.constrain.trie import NameTrie
from server.constrain.vocab import TokenVocab
from server.families.envelope import Envelope


class EnvelopeCompiler:
    """Per (tokenizer, vocab_size, envelope): the preprocessed vocabulary, envelope masks, caches."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        envelope: Envelope,
        backend: str = "xgrammar",
        *,
        any_whitespace: bool = False,
        vocab: TokenVocab | None = None,
        custom: CustomCompiler | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab or TokenVocab.from_tokenizer(tokenizer, vocab_size)
        self.envelope = envelope
        self.backend_name = backend
        self.masks = EnvelopeMasks(self.vocab, envelope, tokenizer)
        # special tokens the arguments grammar writes (Gemma 4's <|"|>), by id, with their text
        grammar_tokens = {self.masks.special_ids[t]: t.encode() for t in envelope.grammar_tokens}
        self.backend = make_backend(
            backend, self.vocab, any_whitespace=any_whitespace, grammar_tokens=grammar_tokens or None
        )
        self.custom = custom or CustomCompiler(self.vocab)  # a Compiler shares one among its envelopes
        self._reasoning: dict[tuple[str, str], ReasoningMasks] = {}

    def trie(self, names: tuple[str, ...]) -> NameTrie:
        """The trie of further (parallel) calls; ``masks.first_trie`` is the first call's."""
        return self.masks.next_trie(names)

    def build(
        self,
        tools: list[dict[str, Any]] | None,
        plan: ToolPlan,
        eos_token_ids: tuple[int, ...] | list[int],
        budget: int | None = None,
    ) -> ToolMatcher | ReasoningMatcher | None:
        """The constraint for one request, or None when no tools were given (nothing to enforce).

        ``budget``: the tokens the reply may have (max_tokens), None = unlimited. With
        ``plan.reasoning`` the tool constraint applies after the reasoning (``ReasoningMatcher``).
        """
        inner = self._tools(tools, plan, eos_token_ids, budget)
        if plan.reasoning is None:
            return inner
        can_call = inner is not None and plan.mode != "none" and bool(plan.allowed)
        return self.reasoning(plan.reasoning, inner, plan.prefill, eos_token_ids, can_call=can_call)

    def reasoning(
        self,
        reasoning: ReasoningPlan,
        inner: TokenMatcher | None,
        prefill: str,
        eos_token_ids: tuple[int, ...] | list[int],
        can_call: bool = False,
        answer_inner: bool = False,
    ) -> ReasoningMatcher:
        """``inner`` (the tool or response_format constraint; None: free text) after the reasoning.

        ``can_call``: ``inner`` may open a call (Harmony then picks the final header or the call's);
        ``answer_inner``: ``inner`` also constrains the answer's text (response_format).
        """
        eos = tuple(sorted(set(eos_token_ids)))
        return ReasoningMatcher(
            self.reasoning_masks(reasoning.open, reasoning.close),
            inner,
            prefill,
            eos,
            reasoning.budget,
            answer_open=reasoning.answer_open,
            call_open=self.envelope.opening if can_call else "",
            answer_inner=answer_inner,
        )

    def reasoning_masks(self, open_text: str, close_text: str) -> ReasoningMasks:
        key = (open_text, close_text)
        found = self._reasoning.get(key)
        if found is None:
            found = self._reasoning.setdefault(
                key, ReasoningMasks(self.vocab, self.tokenizer, open_text, close_text)
            )
        return found

    def _tools(
        self,
        tools: list[dict[str, Any]] | None,
        plan: ToolPlan,
        eos_token_ids: tuple[int, ...] | list[int],
        budget: int | None,
    ) -> ToolMatcher | None:
        names = tool_names(tools)
        if not names:
            return None
        eos = tuple(sorted(set(eos_token_ids)))
        tries: tuple[NameTrie, NameTrie] | None = None
        subset, compiled = 0, dict[int, Any]()
        if plan.mode != "none" and plan.allowed:
            tries = (self.masks.first_trie(names), self.masks.next_trie(names))
            subset = tries[1].subset_bits(plan.allowed)
            by_name = {n: t for n, t in zip(names, tools or [], strict=True)}
            env = self.envelope
            # an envelope that closes its calls (Mistral v3's "]") ends each call's grammar with the
            # close or, if another call may follow, the separator's first character (the trie
            # takes over from there): natural tokens like '"}]' and '"},' stay possible
            tails: tuple[str, ...] = (env.calls_close,) if env.calls_close and not env.sectioned else ()
            if tails and plan.parallel and env.parallel:
                tails += (env.call_separator[:1],)
            parameter = (env.parameter_open, env.parameter_close) if env.arguments == "tagged" else ()
            # a sectioned envelope's call end is a special token, forced after the grammar (call_end.py)
            suffix = "" if env.sectioned else env.call_end
            frame = CallFrame(self.masks.close_rest, suffix, env.arguments, env.call_id, tails, parameter)
            for name in plan.allowed:
                tool = by_name[name]
                fmt = custom_format(tool)
                if fmt is not None:  # a custom tool: its input follows its grammar (custom/)
                    compiled[names.index(name)] = self.custom.compile(name, fmt, frame)
                    continue
                schema = tool_schema(tool)
                if env.key_order == "sorted":
                    schema = sorted_properties(schema)
                compiled[names.index(name)] = self.backend.compile(name, schema, frame)
        if self.masks.end_tokens:  # Kimi, DeepSeek: <|tool_call_end|> after the arguments
            end = EndTokens(self.vocab, self.masks.end_tokens)
            compiled = {i: end.wrap(g, self.backend) for i, g in compiled.items()}
        # an id (Mistral v11) or a literal with special tokens (Harmony) between name and arguments
        between = self.masks.call_id_masks or self.masks.literal_masks
        if between is not None:
            compiled = {i: between.wrap(g, self.backend) for i, g in compiled.items()}
        c = ToolMatcher(self.masks, self.backend, plan, tries, subset, compiled, eos)
        if budget is not None and c.parallel and plan.allowed and self.tokenizer is not None:
            c.budget = budget
            c.min_call = minimal_call_tokens(self.tokenizer, self.envelope, tools or [], plan.allowed)
        return c
