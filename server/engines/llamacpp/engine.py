"""The llamacpp engine: a GGUF served at its quantized size by llama.cpp's kernels (ggml).

What is ours stays ours: the masks (the same constraint objects the hf engine decodes
under), the sampler (hf's ``TokenSampler``: bias, penalties, mask, then greedy or a seeded
draw), the tokenizer (transformers, read from the GGUF once and cached: /tokenize equals
usage) and the family. llama.cpp computes logits.

One engine thread owns the context. Each turn builds ONE ``llama_batch``: the pending token
of every running request (logits wanted) plus up to ``chunk`` prompt tokens of the requests
being admitted (logits on a prompt's last token), decodes it, then masks and samples each
row that has logits. A request's KV lives in a slot (a llama.cpp sequence id, slots.py);
when it ends the slot keeps prompt + reply for the next turn, and a new prompt starts from
the longest prefix any slot holds (``seq_cp``: the unified KV pool shares the cells).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import torch

from server.config import EngineSettings
from server.constrain.bitmask import MaskApplier
from server.constrain.interface import TokenMatcher
from server.engines.base import (
    Engine,
    EngineStats,
    GenerationChunk,
    GenerationRequest,
    TokenLogprob,
    drained,
    engine_error,
)
from server.engines.hf.sampler import TokenSampler
from server.engines.llamacpp.batch import KVFull, Row, Runtime
from server.engines.llamacpp.outbox import Outbox
from server.engines.llamacpp.slots import Slot, SlotTable
from server.errors import ContextLengthExceeded, EngineDead, InvalidRequest
from server.families.model_facts import ModelFacts
from server.model_store import gguf_path

log = logging.getLogger(__name__)

N_SEQ = 32  # slots: running requests + idle sessions' KV (llama.cpp sequence ids)
PREFILL_CHUNK = 512  # prompt tokens per turn (the running requests wait one chunk at most)


@dataclass
class SeqState:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[GenerationChunk]
    constraint: TokenMatcher | None
    stop_ids: frozenset[int]
    sampler: TokenSampler
    outbox: Outbox
    slot: Slot | None = None
    cached_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    pending: int | None = None  # sampled, not yet in the KV
    done: bool = False
    cancelled: bool = False

    def emit(self, chunk: GenerationChunk) -> None:
        """To the client's queue, through the outbox (outbox.py: the engine thread never wakes a loop)."""
        self.outbox.put(self, chunk)


def pool_cells(budget_bytes: int, per_token: int, max_model_len: int) -> int:
    """KV cells of the context: the prefix cache's budget, at least one full window, at most two.

    Every decode step attends over the cells in use (llama.cpp's unified pool), so the pool
    stays near the window: idle sessions beyond it are evicted, least recently used first.
    """
    return max(max_model_len, min(budget_bytes // max(per_token, 1), 2 * max_model_len))


class LlamaCppEngine(Engine):
    name = "llamacpp"

    def __init__(self, settings: EngineSettings, facts: ModelFacts, runtime: Runtime | None = None) -> None:
        """Load ``settings.model`` (a GGUF); or use a given runtime (tests). ``facts`` (tokenizer,
        family, end-of-reply ids) were decided before (``load_model_facts``)."""
        self.settings = settings
        self.facts = facts
        t0 = time.perf_counter()
        self.tokenizer = facts.tokenizer
        if runtime is None:
            from server.engines.llamacpp.runtime import LlamaRuntime  # imports llama_cpp

            runtime = LlamaRuntime(gguf_path(settings.model), settings.threads)
        self.rt = runtime
        n_train = self.rt.n_ctx_train or 2048
        self.max_model_len = min(settings.max_model_len or n_train, n_train)
        pc = settings.prefix_cache
        cells = pool_cells(pc.memory_mb * 2**20, self.rt.kv_bytes_per_token(), self.max_model_len)
        self.chunk = settings.prefill_chunk_tokens or PREFILL_CHUNK
        self.rt.open(cells, N_SEQ, self.chunk + N_SEQ)
        dt = time.perf_counter() - t0
        log.info("loaded %s (llama.cpp, %d KV cells) in %.1f s", settings.model, self.rt.n_ctx, dt)
        self.vocab_size = self.rt.n_vocab
        self.eos_token_ids = facts.end_ids
        self.block_size = 1  # cached_tokens is token-granular
        self.slots = SlotTable(N_SEQ if pc.enabled else 1)
        self.masks = MaskApplier(self.vocab_size)
        self.tokens_generated = 0
        self._inbox: queue.SimpleQueue[SeqState] = queue.SimpleQueue()
        self._waiting: list[SeqState] = []  # admitted order: no slot yet
        self._prefilling: list[SeqState] = []
        self._running: list[SeqState] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._crash: Exception | None = None  # what ended the engine thread's loop (never recovered)
        self._stats = EngineStats()
        self.outbox = Outbox()

    # -- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._thread is None:
            self.outbox.start()
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="llamacpp-engine", daemon=True)
            self._thread.start()

    async def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
            self._thread = None
            await asyncio.to_thread(self.outbox.stop)
        self.rt.close()

    def health(self) -> str | None:
        if self._crash is not None:
            crash = self._crash
            return f"the llamacpp engine's decode thread has stopped ({type(crash).__name__}: {crash})"
        if self._thread is not None and not self._thread.is_alive():
            return "the llamacpp engine's decode thread has stopped"
        return None

    def stats(self) -> EngineStats:
        s = self._stats
        return EngineStats(
            prefix_queries_tokens=s.prefix_queries_tokens,
            prefix_hits_tokens=s.prefix_hits_tokens,
            running=len(self._running) + len(self._prefilling),
            waiting=self._inbox.qsize() + len(self._waiting),
            extra={
                "kv_cells": float(self.rt.n_ctx),
                "idle_cached_tokens": float(self.slots.cached_tokens()),
                "tokens_generated": float(self.tokens_generated),
            },
        )

    @property
    def cache_tiers(self) -> tuple[str, ...]:
        return ("llama.cpp KV cells",)

    def retention_hints(self) -> str | None:
        return (
            "the llamacpp engine keeps idle sessions' KV least recently used first (no per-session retention)"
        )

    # -- requests -------------------------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        if self._thread is None:
            await self.start()
        if (dead := self.health()) is not None:  # nobody would take the request: never a hang
            raise EngineDead(f"{dead}: this worker cannot serve until it is restarted")
        n_prompt = len(request.prompt_ids)
        if n_prompt == 0:
            raise InvalidRequest("the prompt is empty: send at least one token", param="prompt")
        if n_prompt >= self.max_model_len:
            raise ContextLengthExceeded(
                f"the prompt is {n_prompt} tokens but the context window is {self.max_model_len}: "
                f"shorten it (nothing was truncated)",
                param="messages",
            )
        bad = [t for t in request.prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})")
        # compiled by the caller (chat, at prepare time): nothing compiles here
        constraint = request.constraint.matcher if request.constraint is not None else None
        p = request.sampling
        gen = None if p.seed is None else torch.Generator().manual_seed(p.seed)
        seq = SeqState(
            request,
            asyncio.get_running_loop(),
            asyncio.Queue(),
            constraint,
            frozenset((*self.eos_token_ids, *p.stop_token_ids)),
            TokenSampler(p, request.prompt_ids, self.vocab_size, torch.device("cpu"), gen),
            self.outbox,
        )
        self._inbox.put(seq)
        if self._crash is not None:  # the loop ended while this was queued: end it here
            self._fail_inbox(self._crash)
        self._wake.set()
        try:
            while True:
                chunk = await seq.out.get()
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            seq.cancelled = True
            self._wake.set()

    # -- engine thread --------------------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        try:
            while not self._stop.is_set():
                self._admit()
                if self._running or self._prefilling:
                    self._turn()
                elif self._inbox.empty():
                    self._wake.wait(0.5)
                    self._wake.clear()
        except Exception as exc:  # a bug outside one batch: the engine cannot go on
            self._crash = exc  # first: generate() refuses new requests from now on
            log.critical(
                "the llamacpp engine's decode thread died; every request it held fails", exc_info=exc
            )
            held = [*self._running, *self._prefilling, *self._waiting]
            self._running, self._prefilling, self._waiting = [], [], []
            for seq in held:
                seq.emit(GenerationChunk([], seq.cached_tokens, "error", engine_error(exc)))
            self._fail_inbox(exc)

    def _fail_inbox(self, exc: Exception) -> None:
        """End the requests not yet admitted with an error chunk (any thread: the inbox is a queue)."""
        for seq in drained(self._inbox):
            seq.emit(GenerationChunk([], 0, "error", engine_error(exc)))

    def _admit(self) -> None:
        while not self._inbox.empty():
            self._waiting.append(self._inbox.get())
        still: list[SeqState] = []
        for seq in self._waiting:
            if seq.cancelled:
                continue
            req = seq.request
            claim = self.slots.claim(req.prompt_ids, req.cache_salt, req.session_key)
            if claim is None:
                still.append(seq)
                continue
            for gone in claim.dropped:
                self.rt.seq_trim(gone.seq, 0)
            if claim.source is not None:
                self.rt.seq_trim(claim.slot.seq, 0)
                self.rt.seq_copy(claim.source.seq, claim.slot.seq, claim.cached)
            else:
                self.rt.seq_trim(claim.slot.seq, claim.cached)
            seq.slot = claim.slot
            seq.cached_tokens = claim.cached
            self._stats.prefix_queries_tokens += len(req.prompt_ids)
            self._stats.prefix_hits_tokens += claim.cached
            self._prefilling.append(seq)
        self._waiting = still

    def _turn(self) -> None:
        """One batch: every running request's pending token, then prompt chunks up to the budget."""
        for seq in [*self._running, *self._prefilling]:
            if seq.cancelled:
                self._finish(seq, None, keep=True)
        rows: list[Row] = []
        decoding = [s for s in self._running if s.pending is not None]
        for seq in decoding:
            assert seq.slot is not None and seq.pending is not None
            rows.append(Row(seq.pending, len(seq.slot.tokens), seq.slot.seq, True))
        chunks: list[tuple[SeqState, list[int]]] = []
        budget = self.chunk
        for seq in self._prefilling:
            if budget <= 0:
                break
            assert seq.slot is not None
            at = len(seq.slot.tokens)
            part = seq.request.prompt_ids[at : at + budget]
            last = at + len(part) == len(seq.request.prompt_ids)
            for i, t in enumerate(part):
                rows.append(Row(t, at + i, seq.slot.seq, last and i == len(part) - 1))
            chunks.append((seq, part))
            budget -= len(part)
        if not rows:
            return
        try:
            try:
                wanted = self._decode(rows)
            except KVFull:
                if not chunks:
                    raise
                # no idle session left to evict: the prompts being prefilled give way to the running
                for seq, _ in chunks:
                    self._finish(seq, "error", "the KV cache is full: retry when fewer requests run")
                chunks = []
                rows = rows[: len(decoding)]
                wanted = self._decode(rows) if rows else []
        except Exception as exc:  # the batch failed: end its requests, keep the engine
            log.exception("llama.cpp decode of %d rows failed", len(rows))
            for seq in [*decoding, *(s for s, _ in chunks)]:
                self._finish(seq, "error", engine_error(exc), keep=False)
            return
        out = iter(wanted)
        for seq in decoding:
            assert seq.slot is not None and seq.pending is not None
            seq.slot.tokens.append(seq.pending)
            seq.pending = None
            self._pick(seq, self.rt.logits(next(out)))
        for seq, part in chunks:
            assert seq.slot is not None
            seq.slot.tokens.extend(part)
            if len(seq.slot.tokens) == len(seq.request.prompt_ids):
                self._prefilling.remove(seq)
                self._running.append(seq)
                self._pick(seq, self.rt.logits(next(out)))
        self._running = [s for s in self._running if not s.done]

    def _decode(self, rows: list[Row]) -> list[int]:
        """``rows`` through the model; on a full KV pool idle sessions are evicted until they fit."""
        while True:
            try:
                return self.rt.decode(rows)
            except KVFull:
                victim = self.slots.evict_one()
                if victim is None:
                    raise
                self.rt.seq_trim(victim.seq, 0)

    def _pick(self, seq: SeqState, raw: torch.Tensor) -> None:
        """Bias, penalties, the mask, then sample; emit the token or finish (as the hf engine does)."""
        sampler = seq.sampler
        logits = raw
        if sampler.processes or seq.constraint is not None:
            logits = raw.unsqueeze(0).clone()
            sampler.process(logits)
            if seq.constraint is not None:
                logits = self.masks.apply(logits, [seq.constraint])
                if not torch.isfinite(logits).any():
                    self._finish(seq, "error", "the tool-call constraint allows no token at this point")
                    return
            logits = logits[0]
        token = sampler.sample(logits)
        self.tokens_generated += 1
        c = seq.constraint
        if c is not None and not c.accept_token(token):
            self._finish(seq, "error", c.error or f"token {token} rejected by the constraint")
            return
        if token in seq.stop_ids:
            self._finish(seq, "stop")
            return
        sampler.observe(token)
        seq.generated.append(token)
        lp = sampler.logprob(raw, token)
        logprobs: list[TokenLogprob] | None = [lp] if lp is not None else None
        total = len(seq.request.prompt_ids) + len(seq.generated)
        if c is not None and c.is_terminated():
            self._finish(seq, "stop", tokens=[token], logprobs=logprobs)
        elif len(seq.generated) >= seq.request.sampling.max_tokens or total >= self.max_model_len:
            self._finish(seq, "length", tokens=[token], logprobs=logprobs)
        else:
            seq.emit(GenerationChunk([token], seq.cached_tokens, logprobs=logprobs))
            seq.pending = token

    def _finish(
        self,
        seq: SeqState,
        reason: str | None,
        error: str | None = None,
        tokens: list[int] | None = None,
        logprobs: list[TokenLogprob] | None = None,
        keep: bool = True,
    ) -> None:
        """End ``seq`` (``reason`` None: cancelled, nothing sent); its slot keeps its KV if ``keep``."""
        if seq.done:
            return
        seq.done = True
        if seq in self._prefilling:
            self._prefilling.remove(seq)
        if seq in self._running:
            self._running.remove(seq)
        slot = seq.slot
        if slot is not None:
            keep = keep and reason != "error" and self.settings.prefix_cache.enabled
            if not keep:
                self.rt.seq_trim(slot.seq, 0)
            self.slots.release(slot, slot.tokens if keep else [])
            seq.slot = None
        if reason is not None:  # after the bookkeeping: a client that reads stats next sees it done
            seq.emit(GenerationChunk(tokens or [], seq.cached_tokens, reason, error, logprobs))
