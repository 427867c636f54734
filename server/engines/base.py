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

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.masking.builder import ConstraintBuilder
from server.masking.spec import ToolSpec


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    tool_spec: ToolSpec | None = None  # None: unconstrained
    cache_salt: str = ""  # namespace of the prefix cache (tenant); "" = shared
    session_key: str = ""  # the session (prefix-cache retention, cache reports); "" = none


@dataclass
class GenerationChunk:
    """New tokens since the previous chunk. ``cached_tokens`` is set on every chunk."""

    token_ids: list[int]
    cached_tokens: int
    finish_reason: str | None = None  # "stop" | "length" | "error"
    error: str | None = None


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
