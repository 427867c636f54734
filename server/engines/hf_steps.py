"""The hf engine's work on one sequence: prefill, one decode step, finish, and keeping its KV.

``SequenceState`` is a request as the engine thread holds it (KV, next logits, sampler,
constraint, tokens so far). ``SequenceSteps`` (a base of ``HFEngine``) runs the model on
one of them at a time; the engine's scheduler loop (hf.py) decides which and when.

* ``_prefill``: the longest cached prefix from the prefix cache, the rest in chunks of
  ``prefill_chunk`` tokens (stopping if cancelled), the prompt's blocks inserted.
* ``_decode_step``: bias and penalties, then the tool mask, sample one token, check it
  against the constraint and the stop ids, emit it, run the model one token further.
* ``_finish`` / ``_retain``: the last chunk; on a normal end the KV of prompt + generated
  tokens (tail included) goes into the prefix cache for the session's next turn.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from server.engines.base import EngineStats, GenerationChunk, GenerationRequest, TokenLogprob
from server.engines.kv_blocks import BlockCutter, cached_kv
from server.engines.kv_growing import growing_cache, restore
from server.engines.prefix_cache import PrefixCache
from server.engines.sampling import TokenSampler
from server.masking.bitmask import MaskApplier
from server.masking.interface import TokenConstraint


@dataclass
class SequenceState:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[GenerationChunk]
    cancelled: bool = False
    kv: DynamicCache | None = None
    next_logits: torch.Tensor | None = None  # logits for the next token, [V]
    cached_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    sampler: TokenSampler | None = None  # built at admission (bias, penalty state, seeded generator)
    constraint: TokenConstraint | None = None  # built from request.tool_spec by the engine
    stop_ids: frozenset[int] = frozenset()  # the model's EOS ids + the request's stop_token_ids

    def emit(self, chunk: GenerationChunk) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, chunk)


class SequenceSteps:
    """Model steps on one sequence; the engine (``HFEngine``) sets these attributes up."""

    model: Any  # a transformers causal LM
    device: torch.device
    cache: PrefixCache
    prefill_chunk: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    tokens_generated: int
    _masks: MaskApplier
    _stats: EngineStats

    def _prefill(self, seq: SequenceState) -> None:
        ids = seq.request.prompt_ids
        salt = seq.request.cache_salt
        session = seq.request.session_key
        # always leave at least one token to compute: a cache covering the whole input gives no logits
        match = self.cache.match(ids, salt, max_tokens=len(ids) - 1, session=session)
        n_cached = match.cached_tokens
        self._stats.prefix_queries_tokens += len(ids)
        self._stats.prefix_hits_tokens += n_cached
        kv = growing_cache(self.model.config)  # appends in place: no whole-KV copy per step
        stacked = cached_kv(match, self.device)
        t0 = time.perf_counter()
        if stacked is not None:
            restore(kv, stacked)
        logits = None
        for start in range(n_cached, len(ids), self.prefill_chunk):
            if seq.cancelled:
                return
            chunk = torch.tensor([ids[start : start + self.prefill_chunk]], device=self.device)
            out = self.model(input_ids=chunk, past_key_values=kv, use_cache=True, logits_to_keep=1)
            logits = out.logits[0, -1]
        assert logits is not None
        if self.cache.tier2 is not None:  # the cost model weighs restoring against this, measured
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.cache.cost.observe_prefill(len(ids) - n_cached, time.perf_counter() - t0)
        self.cache.insert(ids, salt, BlockCutter(kv, self.cache.block_size), session=session)
        seq.kv = kv
        seq.next_logits = logits
        seq.cached_tokens = n_cached

    def _decode_step(self, seq: SequenceState) -> None:
        req = seq.request
        raw = seq.next_logits
        sampler = seq.sampler
        assert raw is not None and seq.kv is not None and sampler is not None
        constraint = seq.constraint
        logits = raw
        if sampler.processes or constraint is not None:
            logits = raw.float().unsqueeze(0).clone()  # [1, V]: bias, penalties, then the mask
            sampler.process(logits)
            if constraint is not None:
                logits = self._masks.apply(logits, [constraint])
                if not torch.isfinite(logits).any():
                    self._finish(seq, "error", "the tool-call constraint allows no token at this point")
                    return
            logits = logits[0]
        token = sampler.sample(logits)
        self.tokens_generated += 1
        if constraint is not None and not constraint.accept_token(token):
            self._finish(seq, "error", constraint.error or f"token {token} rejected by the constraint")
            return
        if token in seq.stop_ids:
            self._finish(seq, "stop")
            return
        sampler.observe(token)
        seq.generated.append(token)
        lp = sampler.logprob(raw, token)
        logprobs = [lp] if lp is not None else None
        total = len(req.prompt_ids) + len(seq.generated)
        if constraint is not None and constraint.is_terminated():
            self._finish(seq, "stop", tokens=[token], logprobs=logprobs)
            return
        if len(seq.generated) >= req.sampling.max_tokens or total >= self.max_model_len:
            self._finish(seq, "length", tokens=[token], logprobs=logprobs)
            return
        seq.emit(GenerationChunk([token], seq.cached_tokens, logprobs=logprobs))
        out = self.model(
            input_ids=torch.tensor([[token]], device=self.device), past_key_values=seq.kv, use_cache=True
        )
        seq.next_logits = out.logits[0, -1]

    def _retain(self, seq: SequenceState) -> None:
        """Cache the KV of prompt + generated tokens, tail included: the next turn starts with them."""
        if seq.kv is None:
            return
        req = seq.request
        n = seq.kv.get_seq_length()
        ids = (req.prompt_ids + seq.generated)[:n]
        self.cache.insert(
            ids,
            req.cache_salt,
            BlockCutter(seq.kv, self.cache.block_size, n),
            tail=True,
            session=req.session_key,
        )
        # a person by default (a client of the engine alone); the service's word, if it came first, stands
        self.cache.reply_finished(req.session_key, if_running=True)

    def _finish(
        self,
        seq: SequenceState,
        reason: str,
        error: str | None = None,
        tokens: list[int] | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> None:
        seq.emit(GenerationChunk(tokens or [], seq.cached_tokens, reason, error, logprobs))
        if reason != "error":
            self._retain(seq)
        seq.kv = None
        seq.next_logits = None
