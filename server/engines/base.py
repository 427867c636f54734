"""The Engine interface: token ids in, a stream of token chunks out, cache hits counted.

An engine owns the model and its prefix (KV) cache; the model's tokenizer, family and end ids
are decided before it (``ModelFacts``) and given to it. The chat service renders and
tokenizes prompts, plans tools, and turns token chunks into OpenAI responses. Tools cross
this seam in one form, a ``Constraint``: the ``ToolSpec`` (tools, plan, envelope name,
backend, EOS ids) and the matcher chat compiled from it at prepare time with its own
``Compiler`` (a bad schema is a 400 there). The hf and llamacpp engines decode under the
matcher, the vllm engine uses it as its mirror, and vLLM's engine core (another process)
builds its own from the spec's JSON form. No engine compiles a spec.

Cancellation: closing the async iterator returned by ``generate`` (``aclose()``, or
leaving an ``async for`` early) cancels the request and frees its resources.
"""

from __future__ import annotations

import abc
import queue
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from server.constrain.constraint import Constraint
from server.constrain.errors import ConstraintError
from server.errors import InvalidRequest
from server.families.model_facts import ModelFacts


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
    constraint: Constraint | None = None  # None: unconstrained (see the module doc)
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


class Engine(abc.ABC):
    """What chat (and the api layer) may use of an engine: everything is declared here.

    A subclass sets the attributes in its ``__init__`` and implements the abstract methods;
    an engine missing one cannot be instantiated. The concrete methods are defaults for an
    engine that truly has nothing to say (documented on each); nobody probes with ``getattr``.
    """

    name: str  # "hf" | "vllm" | a test's name (/health and /v1/models show it)
    facts: ModelFacts  # decided before the engine and given to its constructor (families/model_facts.py)
    tokenizer: Any  # facts.tokenizer: a transformers PreTrainedTokenizerBase
    max_model_len: int
    vocab_size: int  # rows of the logits (may exceed len(tokenizer))
    eos_token_ids: tuple[int, ...]  # facts.end_ids: the engine's stop set, the masks' EOS
    block_size: int  # tokens per prefix-cache block (what cached_tokens is a multiple of)

    # -- lifecycle -----------------------------------------------------------------------------
    @abc.abstractmethod
    async def start(self) -> None:
        """Load / start what serving needs (idempotent; ``generate`` starts a stopped engine)."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Stop serving and free the model's resources."""

    def health(self) -> str | None:
        """None while the engine can serve; else why not (/health answers 503 with it).

        Default: always healthy (an engine with no background worker that could die).
        """
        return None

    # -- requests ------------------------------------------------------------------------------
    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Token chunks of one request; closing the iterator cancels it (see the module doc)."""

    def check_sampling(self, params: SamplingParams) -> None:
        """Raise ``InvalidRequest`` (400) for sampling this engine cannot honour (called at prepare).

        Default: every ``SamplingParams`` is honoured.
        """
        return None

    # -- statistics and the prefix cache -------------------------------------------------------
    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """Prefix-cache and scheduler counters for /metrics."""

    @property
    def cache_tiers(self) -> tuple[str, ...]:
        """Where the prefix cache keeps blocks, first tier to last (cache-miss reasons name them).

        Default: none known (``cache_location`` then says "the engine's KV cache").
        """
        return ()

    def retention_hints(self) -> str | None:
        """None when the prefix cache uses the client's retention hint (``GenerationRequest.retain_s``:
        ``cache_control`` ttl, ``prompt_cache_retention``); else why not, which a response carrying a
        hint says (``cache.retention_hint``) and /health says: never a silently ignored parameter.

        Default: not used (an engine whose cache does not know sessions).
        """
        return f"the {self.name} engine's prefix cache keeps no per-session retention"

    def cache_location(self) -> str:
        """Where an evicted block was lost from: the last tier (cache-miss reasons)."""
        tiers = self.cache_tiers
        return str(tiers[-1]) if tiers else "the engine's KV cache"

    def request_arrived(self, session_key: str) -> None:
        """The chat service says a request of the session arrived (before it waits for the engine):
        a session-aware cache keeps the session's prefix from now on, however long the wait.
        Default: nothing to do (an engine whose cache does not know sessions).
        """
        return None

    def reply_finished(self, session_key: str, tool_names: Sequence[str] = ()) -> None:
        """The chat service says how a session's reply ended: tool calls (named) or text (none).

        A session-aware cache keeps what the session will need next. Default: nothing to do
        (an engine whose cache does not know sessions).
        """
        return None


T = TypeVar("T")


def engine_error(exc: Exception) -> str:
    """The error text of a request an engine could not finish: the exception named."""
    return f"engine error: {type(exc).__name__}: {exc}"


def drained(waiting: queue.SimpleQueue[T]) -> Iterator[T]:
    """What ``waiting`` holds now, taken out one by one (any thread: the queue is thread-safe)."""
    while True:
        try:
            yield waiting.get_nowait()
        except queue.Empty:
            return
