"""The llamacpp engine's scheduler: waiting → prefilling → running, one ``llama_batch`` a turn.

Each turn builds ONE batch: the pending token of every running request (logits wanted) plus up
to ``chunk`` prompt tokens of the requests being admitted (logits on a prompt's last token),
decodes it, then masks and samples each row that has logits (``pick``: bias, penalties, the
mask, then greedy or a seeded draw, as the hf engine does). Admission claims a slot (slots.py)
and starts the prompt from the longest prefix any slot holds, or tier 2 holds when that is
longer (placement.py, tier2.py). An idle slot's KV leaves the pool only through
``KVPlacement.evict``, which saves it to tier 2 first; with tier 2 on, every idle slot goes
there once a request is admitted (``spill_idle``). Runs on the engine thread only;
``inbox`` is the one thing other threads touch.
"""

from __future__ import annotations

import logging
import queue

import torch

from server.constrain.bitmask import MaskApplier
from server.engines.base import EngineStats, GenerationChunk, TokenLogprob, drained, engine_error
from server.engines.hf.sampler import pick
from server.engines.llamacpp.batch import KVFull, Row, Runtime
from server.engines.llamacpp.placement import KVPlacement
from server.engines.llamacpp.retention import SlotRetention
from server.engines.llamacpp.sequence import SeqState
from server.engines.llamacpp.slots import SlotTable
from server.engines.llamacpp.tier2 import SavedSlots

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        rt: Runtime,
        slots: SlotTable,
        chunk: int,
        max_model_len: int,
        keep_kv: bool,
        stats: EngineStats,
        saved: SavedSlots | None = None,
        retention: SlotRetention | None = None,
    ) -> None:
        """``chunk``: prompt tokens per turn; ``keep_kv``: a finished request's slot keeps its
        KV for the next turn (the prefix cache is on); ``stats``: the prefix counters, updated;
        ``saved``: tier 2 (None: off); ``retention``: told when a session's request starts and ends."""
        self.rt = rt
        self.slots = slots
        self.saved = saved if saved is not None else SavedSlots(None)
        self.kv = KVPlacement(rt, slots, self.saved)
        self.retention = retention if retention is not None else SlotRetention("lru", 600.0)
        self.chunk = chunk
        self.max_model_len = max_model_len
        self.keep_kv = keep_kv
        self.stats = stats
        self.masks = MaskApplier(rt.n_vocab)
        self.tokens_generated = 0
        self.preemptions = 0  # running requests that gave way on a full pool
        self.inbox: queue.SimpleQueue[SeqState] = queue.SimpleQueue()
        self.waiting: list[SeqState] = []  # admitted order: no slot yet
        self.prefilling: list[SeqState] = []
        self.running: list[SeqState] = []

    @property
    def busy(self) -> bool:
        return bool(self.running or self.prefilling)

    def fail_all(self, exc: Exception) -> None:
        """The engine thread dies: every request held or queued ends with an error chunk."""
        held = [*self.running, *self.prefilling, *self.waiting]
        self.running, self.prefilling, self.waiting = [], [], []
        for seq in held:
            seq.emit(GenerationChunk([], seq.cached_tokens, "error", engine_error(exc)))
        self.fail_inbox(exc)

    def fail_inbox(self, exc: Exception) -> None:
        """End the requests not yet admitted with an error chunk (any thread: the inbox is a queue)."""
        for seq in drained(self.inbox):
            seq.emit(GenerationChunk([], 0, "error", engine_error(exc)))

    def admit(self) -> None:
        while not self.inbox.empty():
            self.waiting.append(self.inbox.get())
        still: list[SeqState] = []
        admitted = False
        for seq in self.waiting:
            if seq.cancelled:
                continue
            req = seq.request
            claim = self.slots.claim(seq.prompt, req.cache_salt, req.session_key)
            if claim is None:
                still.append(seq)
                continue
            for gone in claim.dropped:
                self.kv.evict(gone)
            seq.slot = claim.slot
            self.retention.began(req.session_key, req.retain_s)
            cached = self.kv.place(claim, seq.prompt, req.cache_salt)
            if not seq.deferred:  # a deferred request keeps what it found at its first admission
                seq.cached_tokens = cached
                self.stats.prefix_queries_tokens += len(req.prompt_ids)
                self.stats.prefix_hits_tokens += cached
            self.prefilling.append(seq)
            admitted = True
        self.waiting = still
        if admitted:  # once the new requests hold their slots: idle KV to tier 2 (when it is on)
            self.kv.spill_idle()

    def turn(self) -> None:
        """One batch: every running request's pending token, then prompt chunks up to the budget."""
        for seq in [*self.running, *self.prefilling]:
            if seq.cancelled:
                self.finish(seq, None, keep=True)
        rows: list[Row] = []
        decoding = [s for s in self.running if s.pending is not None]
        for seq in decoding:
            assert seq.slot is not None and seq.pending is not None
            rows.append(Row(seq.pending, len(seq.slot.tokens), seq.slot.seq, True))
        chunks: list[tuple[SeqState, list[int]]] = []
        budget = self.chunk
        for seq in self.prefilling:
            if budget <= 0:
                break
            assert seq.slot is not None
            at, target = len(seq.slot.tokens), seq.prompt
            part = target[at : at + budget]
            last = at + len(part) == len(target) and seq.pending is None  # resumed: pending is next
            for i, t in enumerate(part):
                rows.append(Row(t, at + i, seq.slot.seq, last and i == len(part) - 1))
            chunks.append((seq, part))
            budget -= len(part)
        if not rows:
            return
        try:
            wanted = self.decode_fitting(rows, decoding, chunks)
        except Exception as exc:  # the batch failed: end its requests, keep the engine
            log.exception("llama.cpp decode of %d rows failed", len(rows))
            for seq in [*decoding, *(s for s, _ in chunks)]:
                self.finish(seq, "error", engine_error(exc), keep=False)
            return
        out = iter(wanted)
        for seq in decoding:
            assert seq.slot is not None and seq.pending is not None
            seq.slot.tokens.append(seq.pending)
            seq.pending = None
            self.pick(seq, self.rt.logits(next(out)))
        for seq, part in chunks:
            assert seq.slot is not None
            seq.slot.tokens.extend(part)
            if len(seq.slot.tokens) == len(seq.prompt):
                self.prefilling.remove(seq)
                self.running.append(seq)
                if seq.pending is None:
                    self.pick(seq, self.rt.logits(next(out)))
        self.running = [s for s in self.running if not s.done]

    def decode_fitting(
        self, rows: list[Row], decoding: list[SeqState], chunks: list[tuple[SeqState, list[int]]]
    ) -> list[int]:
        """Decode ``rows``; while the pool has no room even with every idle slot evicted, the last
        prompt chunk gives way: its request waits (first in line, its KV so far kept in its slot,
        idle: it takes it back when admitted again) and the running requests go on. With no prompt
        chunk left, the newest running request gives way (``preempt``) while another runs: the
        oldest always goes on. ``chunks`` and ``decoding`` keep the ones decoded. A prompt that
        fits nowhere, with nothing else in the batch, ends with an error (never a wait that cannot
        end)."""
        while True:
            try:
                return self.decode(rows)
            except KVFull:
                if not chunks:
                    if len(decoding) < 2:
                        raise
                    self.preempt(decoding.pop())
                    rows.pop()  # the rows are the decoding requests' own, in order
                    continue
                seq, part = chunks.pop()
                del rows[len(rows) - len(part) :]
                if not rows:
                    self.finish(seq, "error", "the KV cache cannot hold this prompt: shorten it")
                    return []
                self.defer(seq)

    def preempt(self, seq: SeqState) -> None:
        """A running request gives way on a full pool: its slot goes idle with its KV (the next
        eviction takes it, saved to tier 2 when that is on) and it waits first in line. Admitted
        again, it computes what its slot held (prompt and reply so far) from whatever prefix is
        left, then decodes its pending token: the same tokens as if it had never stopped. The
        client sees a pause, never an error."""
        assert seq.slot is not None
        self.running.remove(seq)
        seq.resume = list(seq.slot.tokens)
        self.preemptions += 1
        log.info("full KV pool: request %s gives way at %d tokens", seq.request.request_id, len(seq.resume))
        self.defer(seq)

    def defer(self, seq: SeqState) -> None:
        """``seq`` leaves prefilling (or running) for the front of the line; its slot keeps its KV, idle."""
        if seq in self.prefilling:
            self.prefilling.remove(seq)
        if seq.slot is not None:
            self.slots.release(seq.slot, seq.slot.tokens)
            seq.slot = None
        seq.deferred = True
        self.waiting.insert(0, seq)

    def decode(self, rows: list[Row]) -> list[int]:
        """``rows`` through the model; on a full KV pool idle sessions are evicted until they fit."""
        while True:
            try:
                return self.rt.decode(rows)
            except KVFull:
                victim = self.slots.evict_one()
                if victim is None:
                    raise
                self.kv.evict(victim)

    def pick(self, seq: SeqState, raw: torch.Tensor) -> None:
        """Bias, penalties, the mask, then sample; emit the token or finish (as the hf engine does)."""
        step = pick(
            raw,
            seq.sampler,
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
        else:
            seq.emit(GenerationChunk(step.tokens, seq.cached_tokens, logprobs=step.logprobs))
            seq.pending = step.token

    def finish(
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
        if seq in self.prefilling:
            self.prefilling.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        slot = seq.slot
        if slot is not None:
            keep = keep and reason != "error" and self.keep_kv
            if not keep:
                self.rt.seq_trim(slot.seq, 0)
            self.slots.release(slot, slot.tokens if keep else [], len(seq.request.prompt_ids))
            # text unless the chat service says it was tool calls (its word may come first: kept)
            self.retention.finished(seq.request.session_key, if_running=True)
            seq.slot = None
        if reason is not None:  # after the bookkeeping: a client that reads stats next sees it done
            seq.emit(GenerationChunk(tokens or [], seq.cached_tokens, reason, error, logprobs))
