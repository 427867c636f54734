"""The llamacpp engine: a GGUF served at its quantized size by llama.cpp's kernels (ggml).

What is ours stays ours: the masks (the same constraint objects the hf engine decodes
under), the sampler (hf's ``TokenSampler``: bias, penalties, mask, then greedy or a seeded
draw), the tokenizer (transformers, read from the GGUF once and cached: /tokenize equals
usage) and the family. llama.cpp computes logits.

One engine thread owns the context and runs the scheduler's turns (scheduler.py: ONE
``llama_batch`` a turn for every running request's token and the admitted prompts' chunks,
then masks and samples each row that has logits). A request's KV lives in a slot (a llama.cpp
sequence id, slots.py); when it ends the slot keeps prompt + reply for the next turn, and a new
prompt starts from the longest prefix any slot holds (``seq_cp``: the unified KV pool shares
the cells). With ``prefix_cache.tier2`` an evicted idle slot's KV is saved (host RAM or a folder)
and loaded back when its session returns (tier2.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence

import torch

from server.config import EngineSettings
from server.engines.base import (
    Engine,
    EngineStats,
    GenerationChunk,
    GenerationRequest,
)
from server.engines.hf.sampler import TokenSampler
from server.engines.llamacpp.batch import Runtime
from server.engines.llamacpp.outbox import Outbox
from server.engines.llamacpp.retention import SlotRetention
from server.engines.llamacpp.scheduler import Scheduler
from server.engines.llamacpp.sequence import SeqState
from server.engines.llamacpp.slots import SlotTable
from server.engines.llamacpp.tier2 import SavedSlots, default_budget_mb
from server.errors import ContextLengthExceeded, EngineDead, InvalidRequest
from server.families.model_facts import ModelFacts
from server.heap import release_free_heap
from server.kvcache.tier2 import make_store
from server.model_store import gguf_path

log = logging.getLogger(__name__)

N_SEQ = 32  # slots: running requests + idle sessions' KV (llama.cpp sequence ids)
PREFILL_CHUNK = 512  # prompt tokens per turn (the running requests wait one chunk at most)


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
        self.retention = SlotRetention(pc.policy, pc.session_cap_s)
        self.slots = SlotTable(N_SEQ if pc.enabled else 1, self.retention.victim)
        t2 = pc.tier2  # "never" restores nothing: then saving would be wasted work
        on = pc.enabled and t2.restore != "never"
        store = make_store(t2.budget_mb(default_budget_mb()), t2.path, "cpu") if on else None
        self.saved = SavedSlots(store)
        self._stats = EngineStats()
        self.scheduler = Scheduler(
            self.rt,
            self.slots,
            self.chunk,
            self.max_model_len,
            pc.enabled,
            self._stats,
            self.saved,
            self.retention,
        )
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._crash: Exception | None = None  # what ended the engine thread's loop (never recovered)
        self.outbox = Outbox()
        self._torch_threads: int | None = None  # torch's intra-op threads before start() (restored)

    # -- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._thread is None:
            # torch only reads the logits here (argmax, masks, sampling over one [V] row): its own
            # OpenMP team, woken per token beside llama.cpp's and spinning after, took a core from
            # the decode (1B Q4_K_M, 2 cores: 72.2 -> 69.2 ms a token with one torch thread)
            if self._torch_threads is None:
                self._torch_threads = torch.get_num_threads()
                torch.set_num_threads(1)
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
        if self._torch_threads is not None:  # the process's setting back (tests run engines in turn)
            torch.set_num_threads(self._torch_threads)
            self._torch_threads = None
        self.rt.close()

    def health(self) -> str | None:
        if self._crash is not None:
            crash = self._crash
            return f"the llamacpp engine's decode thread has stopped ({type(crash).__name__}: {crash})"
        if self._thread is not None and not self._thread.is_alive():
            return "the llamacpp engine's decode thread has stopped"
        return None

    def stats(self) -> EngineStats:
        s, sched = self._stats, self.scheduler
        return EngineStats(
            prefix_queries_tokens=s.prefix_queries_tokens,
            prefix_hits_tokens=s.prefix_hits_tokens,
            running=len(sched.running) + len(sched.prefilling),
            waiting=sched.inbox.qsize() + len(sched.waiting),
            extra={
                "kv_cells": float(self.rt.n_ctx),
                "idle_cached_tokens": float(self.slots.cached_tokens()),
                "tokens_generated": float(sched.tokens_generated),
                "preemptions": float(sched.preemptions),
                **self._tier2_stats(),
            },
        )

    def _tier2_stats(self) -> dict[str, float]:
        store = self.saved.store
        if store is None:
            return {}
        return {
            "tier2_sessions": float(len(self.saved)),
            "tier2_used_bytes": float(store.used_bytes),
            "tier2_saved_tokens": float(self.saved.saved_tokens),
            "tier2_restored_tokens": float(self.saved.restored_tokens),
            "tier2_bytes_written": float(store.bytes_written),
            "tier2_bytes_read": float(store.bytes_read),
        }

    @property
    def cache_tiers(self) -> tuple[str, ...]:
        store = self.saved.store
        if store is None:
            return ("llama.cpp KV cells",)
        where = getattr(store, "path", None)
        return ("llama.cpp KV cells", f"tier 2 (disk folder {where})" if where else "tier 2 (host RAM)")

    def retention_hints(self) -> str | None:
        """Used by the ``session`` policy (how long a paused session counts as live); not by ``lru``."""
        return self.settings.prefix_cache.hint_unused("idle sessions")

    def request_arrived(self, session_key: str) -> None:
        """The service says a request of the session arrived (it may still wait for a slot)."""
        self.retention.arrived(session_key)

    def reply_finished(self, session_key: str, tool_names: Sequence[str] = ()) -> None:
        """The service says what the session's reply ended with: tool calls (named) or text."""
        self.retention.finished(session_key, tuple(tool_names))

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
        self.scheduler.inbox.put(seq)
        if self._crash is not None:  # the loop ended while this was queued: end it here
            self.scheduler.fail_inbox(self._crash)
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
            worked = False
            while not self._stop.is_set():
                self.scheduler.admit()
                if self.scheduler.busy:
                    self.scheduler.turn()
                    worked = True
                elif self.scheduler.inbox.empty():
                    if worked:  # just went idle: what the requests' buffers freed goes back (heap.py)
                        release_free_heap()
                        worked = False
                    self._wake.wait(0.5)
                    self._wake.clear()
        except Exception as exc:  # a bug outside one batch: the engine cannot go on
            self._crash = exc  # first: generate() refuses new requests from now on
            log.critical(
                "the llamacpp engine's decode thread died; every request it held fails", exc_info=exc
            )
            self.scheduler.fail_all(exc)
