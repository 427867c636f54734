"""The Engine interface: token ids in, a stream of token chunks out, cache hits counted.

An engine owns the model, its tokenizer, its prefix (KV) cache and its constraint builder.
The chat service renders and tokenizes prompts, plans tools, and turns token chunks into
OpenAI responses. Tools cross this seam as data: a ``ToolSpec`` (tools, plan, envelope
name, backend, EOS ids), never a live constraint; each engine builds the constraint where
it decodes (``ConstraintBuilder``: in-process for hf, in vLLM's engine core for vllm).

Cancellation: closing the async iterator returned by ``generate`` (``aclose()``, or
leaving an ``async for`` early) cancels the request and frees its resources.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.constrain.builder import ConstraintBuilder
from server.constrain.errors import ConstraintError
from server.constrain.spec import ToolSpec
from server.errors import InvalidRequest


@contextmanager
def constraint_errors_as_400() -> Iterator[None]:
    """A ``ConstraintError`` of the mask library as an ``InvalidRequest`` (400), message and param kept.

    The one place the mapping is written: chat's prepare step and the engines' constraint
    builds run under it (also usable as a decorator).
    """
    try:
        yield
    except ConstraintError as exc:
        raise InvalidRequest(exc.message, param=exc.param) from exc


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each token (OpenAI semantics; ``top_k``, ``min_p``, ``repetition_penalty`` as vLLM's).

    Order on both engines: logit_bias, penalties, the tool mask (last: a bias cannot re-allow
    a masked token), then temperature, min_p, top_k, top_p. ``logprobs`` (None: none; N: the
    chosen token's logprob and the N most likely) are the model's raw log-softmax, before any
    of that processing (vLLM's default ``logprobs_mode="raw_logprobs"``).
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    frequency_penalty: float = 0.0  # minus this × times the token was generated
    presence_penalty: float = 0.0  # minus this once the token was generated
    repetition_penalty: float = 1.0  # tokens of prompt + output: logit / p if > 0 else logit × p
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # drop tokens below min_p × the top token's probability
    logprobs: int | None = None  # None: no logprobs; N >= 0: the chosen token's + N top ones


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability and (when asked) the most likely alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    tool_spec: ToolSpec | None = None  # None: unconstrained
    cache_salt: str = ""  # namespace of the prefix cache (tenant); "" = shared
    session_key: str = ""  # the session (prefix-cache retention, cache reports); "" = none
    retain_s: float = 0.0  # client's hint: keep the session's KV this long after a reply (0: none)


@dataclass
class GenerationChunk:
    """New tokens since the previous chunk. ``cached_tokens`` is set on every chunk."""

    token_ids: list[int]
    cached_tokens: int
    finish_reason: str | None = None  # "stop" | "length" | "error"
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked for them


@dataclass
class EngineStats:
    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    running: int = 0
    waiting: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class Engine(Protocol):
    name: str
    tokenizer: Any  # a transformers PreTrainedTokenizerBase
    max_model_len: int
    vocab_size: int  # rows of the logits (may exceed len(tokenizer))
    eos_token_ids: tuple[int, ...]
    block_size: int  # tokens per prefix-cache block (what cached_tokens is a multiple of)
    constraints: ConstraintBuilder  # builds (and warms) the constraint of a ToolSpec

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]: ...

    def stats(self) -> EngineStats: ...
