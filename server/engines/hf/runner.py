"""The model runner: the model's work on sequences (prefill, one decode step, finish, keep the KV).

``Runner`` (the engine's ``runner``, a part it owns, not a base class) runs the model on the
sequences the scheduler hands it (scheduler.py decides which and when); a sequence is a
``SequenceState`` (sequence.py).

* ``prefill_take`` / ``prefill_forward`` / ``prefill_end``: the longest cached prefix from
  the prefix cache, then the rest one chunk of at most ``chunk_tokens`` tokens a turn,
  several sequences' chunks as the rows of one forward (``model/rows.py``), the prompt's
  blocks inserted into the prefix cache at the end.
* ``pick`` + ``forward``: bias and penalties, then the tool mask, sample one token, check
  it against the constraint and the stop ids, emit it; then every running sequence's token
  goes through the model in ONE forward (``model/rows.py`` ``decode_rows``: batched decode,
  each row over its own KV or its slot of the pool).
* ``finish`` / ``retain``: the last chunk; on a normal end the KV of prompt + generated
  tokens (tail included) goes into the prefix cache for the session's next turn.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from server.constrain.bitmask import MaskApplier
from server.engines.base import EngineStats, GenerationChunk, GenerationRequest, TokenLogprob
from server.engines.hf.kv.blocks import BlockCutter, cached_kv, match_parts
from server.engines.hf.kv.growing import cache_kw, growing_cache, restore
from server.engines.hf.kv.slots import HEADROOM, KVSlots
from server.engines.hf.linears.prefill_dtype import prefill
from server.engines.hf.model.lean import lean_decode_supported
from server.engines.hf.model.rows import decode_attention, decode_rows, prefill_rows
from server.engines.hf.model.shared_prefix import common_prefix
from server.engines.hf.outbox import flush
from server.engines.hf.sampler import TokenSampler, pick
from server.engines.hf.sequence import SequenceState
from server.kvcache.prefix_cache import PrefixCache


class Runner:
    """Model steps on sequences, owned by the engine (``HFEngine.runner``); its scheduler decides when.

    Holds what the steps need: the model, its device, the prefix cache, the prefill chunk
    size, the context window, the bitmask buffers and the engine's prefix counters.
    """

    def __init__(
        self,
        model: Any,
        device: torch.device,
        cache: PrefixCache,
        chunk_tokens: int,
        max_model_len: int,
        vocab_size: int,
        stats: EngineStats,
        slots: KVSlots | None = None,
    ) -> None:
        self.model = model  # a transformers causal LM
        self.device = device
        self.cache = cache
        self.chunk_tokens = chunk_tokens  # tokens per prefill forward
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.masks = MaskApplier(vocab_size)
        self.stats = stats  # the engine's: prefix queries / hits are counted here
        self.tokens_generated = 0  # all decode steps ever taken (cancellation tests read it)
        self.slots = slots  # the pool running sequences' KV lives in (None: each its own buffers)
        self._shared: tuple[list[SequenceState], int] = ([], 0)  # the last step's rows, their common prefix

    def sampler(self, request: GenerationRequest) -> TokenSampler:
        """The request's sampler: bias, penalty state over the prompt, its seeded generator if any."""
        seed = request.sampling.seed
        generator = None if seed is None else torch.Generator(device=self.device).manual_seed(seed)
        return TokenSampler(request.sampling, request.prompt_ids, self.vocab_size, self.device, generator)

    def prefill(self, seq: SequenceState) -> None:
        """The whole prefill at once (probes and benchmarks; the engine loop goes chunk by chunk)."""
        while not self.prefill_chunk(seq) and not seq.cancelled:
            pass

    def prefill_begin(self, seq: SequenceState) -> None:
        ids = seq.request.prompt_ids
        if seq.sampler is None:  # built on the engine thread: its tensors may fill in parallel (engine.py)
            seq.sampler = self.sampler(seq.request)
        # always leave at least one token to compute: a cache covering the whole input gives no logits
        match = self.cache.match(
            ids,
            seq.request.cache_salt,
            max_tokens=len(ids) - 1,
            session=seq.request.session_key,
            retain_s=seq.request.retain_s,
        )
        n_cached = match.cached_tokens
        self.stats.prefix_queries_tokens += len(ids)
        self.stats.prefix_hits_tokens += n_cached
        kv = growing_cache(self.model.config)  # appends in place: no whole-KV copy per step
        if self.slots is not None:  # a slot for the prompt and some headroom (rows grow later)
            reply = min(seq.request.sampling.max_tokens, HEADROOM)
            self.slots.admit(kv, min(len(ids) + reply, self.max_model_len))
        parts = match_parts(match)
        seq.prefill_t0 = time.perf_counter()
        if parts and (self.slots is None or not self.slots.restore(kv, parts)):
            restore(kv, cached_kv(parts, self.device))
        seq.kv = kv
        seq.cached_tokens = n_cached
        seq.prefill_at = n_cached

    def prefill_chunk(self, seq: SequenceState, limit: int | None = None) -> bool:
        """Prefill the next ``chunk_tokens`` (at most ``limit``) tokens of the prompt; True once done.

        At most one chunk per engine-loop turn: a long prompt delays the running requests'
        decode by at most one chunk per step.
        """
        chunk = self.prefill_take(seq, limit)
        return self.prefill_end(seq, len(chunk), self.prefill_forward([seq], [chunk])[0])

    def prefill_take(self, seq: SequenceState, limit: int | None = None) -> list[int]:
        """The next chunk of ``seq``'s prompt to compute: ``chunk_tokens`` at most, ``limit`` at most."""
        if seq.prefill_at < 0:
            self.prefill_begin(seq)
        n = self.chunk_tokens if limit is None else max(1, min(limit, self.chunk_tokens))
        return seq.request.prompt_ids[seq.prefill_at : seq.prefill_at + n]

    def prefill_forward(self, seqs: list[SequenceState], chunks: list[list[int]]) -> torch.Tensor:
        """Each chunk appended to its sequence's KV; each one's last logits [B, V].

        One forward for all (``model/rows.py`` ``prefill_rows``) where the family allows it, else one
        transformers forward per sequence. In the prefill's dtype (``engine.prefill_dtype``,
        linears/prefill_dtype.py): the linears always, the attention in the rows forward.
        """
        with prefill(self.model) as dtype:
            if lean_decode_supported(self.model):
                kvs = [s.kv for s in seqs]
                starts = [s.prefill_at for s in seqs]
                return prefill_rows(self.model, kvs, chunks, starts, self.device, dtype)
            rows = []
            for seq, chunk in zip(seqs, chunks, strict=True):
                ids = torch.tensor([chunk], device=self.device)
                kw = cache_kw(self.model, seq.kv)
                out = self.model(input_ids=ids, **kw, use_cache=True, logits_to_keep=1)
                rows.append(out.logits[0, -1])
            return torch.stack(rows)

    def prefill_end(self, seq: SequenceState, n: int, logits: torch.Tensor) -> bool:
        """``n`` more prompt tokens are in ``seq``'s KV (``logits`` after the last); True once all are."""
        ids = seq.request.prompt_ids
        seq.prefill_at = min(len(ids), seq.prefill_at + n)
        if seq.prefill_at < len(ids):
            return False
        if self.cache.tier2 is not None:  # the cost model weighs restoring against this, measured
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.cache.cost.observe_prefill(
                len(ids) - seq.cached_tokens, time.perf_counter() - seq.prefill_t0
            )
        self.cache.insert(
            ids,
            seq.request.cache_salt,
            BlockCutter(seq.kv, self.cache.block_size),
            session=seq.request.session_key,
        )
        seq.next_logits = logits
        return True

    def decode_step(self, seq: SequenceState) -> None:
        """One decode step of one sequence alone (a batch of one)."""
        self.pick(seq)
        if seq.pending is not None:
            self.forward([seq])

    def pick(self, seq: SequenceState) -> None:
        """Sample the next token from ``next_logits`` and emit it, or finish the sequence.

        Leaves the token in ``seq.pending`` when the sequence goes on (``forward`` runs it).
        """
        seq.pending = None
        raw = seq.next_logits
        sampler = seq.sampler
        assert raw is not None and seq.kv is not None and sampler is not None
        step = pick(
            raw,
            sampler,
            seq.constraint,
            self.masks,
            seq.stop_ids,
            seq.generated,
            len(seq.request.prompt_ids),
            self.max_model_len,
        )
        self.tokens_generated += step.sampled
        if step.finish is not None:
            self.finish(seq, step.finish, step.error, tokens=step.tokens, logprobs=step.logprobs)
            return
        seq.emit(GenerationChunk(step.tokens, seq.cached_tokens, logprobs=step.logprobs))
        seq.pending = step.token

    def forward(self, seqs: list[SequenceState]) -> None:
        """Run each sequence's pending token through the model: one forward for all of them."""
        tokens = [s.pending for s in seqs]
        assert all(t is not None for t in tokens)
        with decode_attention(self.device):  # a batch of one too: the same (lean) forward
            kvs = [s.kv for s in seqs]
            shared = self.shared_prefix(seqs)
            logits = decode_rows(self.model, kvs, tokens, self.device, self.slots, shared)  # type: ignore[arg-type]
        for i, seq in enumerate(seqs):
            seq.next_logits = logits[i]
        for seq in seqs:
            seq.pending = None

    def shared_prefix(self, seqs: list[SequenceState]) -> int:
        """Prompt tokens every running sequence starts with; worked out again when the rows change."""
        rows = self._shared[0]
        if len(rows) != len(seqs) or any(a is not b for a, b in zip(rows, seqs, strict=True)):
            prompts = [s.request.prompt_ids for s in seqs]
            self._shared = (list(seqs), common_prefix(prompts, [s.request.cache_salt for s in seqs]))
        return self._shared[1]

    def retain(self, seq: SequenceState) -> None:
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

    def finish(
        self,
        seq: SequenceState,
        reason: str,
        error: str | None = None,
        tokens: list[int] | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> None:
        seq.emit(GenerationChunk(tokens or [], seq.cached_tokens, reason, error, logprobs))
        flush()  # the reply's end reaches its client now, not after caching its KV (outbox.py)
        if reason != "error":
            self.retain(seq)
        seq.kv = None
        seq.next_logits = None
        if self.slots is not None:
            self.slots.collect()  # its slot, if the cache is gone now
