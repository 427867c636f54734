"""The hf engine: transformers + torch, a block-hash prefix cache, one engine thread.

This module is the engine's shell: it loads the model, builds the parts, runs the engine
thread and answers the ``Engine`` contract (base.py). The parts, each in its own module:

* ``Scheduler`` (scheduler.py): waiting → prefilling → running; each loop turn prefills one
  chunk of prompt tokens (reusing the longest cached prefix), then advances every running
  request by one token in ONE batched forward (continuous batching: requests join after
  their prefill and leave when they finish, between steps). A long prompt delays the
  others' decode by one chunk per step, no more.
* ``Runner`` (runner.py): the model's work on sequences (``SequenceState``, sequence.py):
  prefill, pick (sampler.py, the masks), the rows forward (model/), finish, retain.
* KV memory (kv/): each request keeps its own KV -- a slot of the ``KVSlots`` pool when it
  fits, so one attention call a layer serves the step -- and a reused prefix is copied once,
  at admission, never per step.
* Linears (linears/): fused projections and the CPU kernels, installed on the engine thread.

Torch work that may run in parallel (the linears' reorder, a sampler's tensors, every
forward) runs on the engine thread only: a second thread's OpenMP team makes libgomp stop
spinning between parallel regions, and a decode step slows by a quarter (linears/onednn.py).
Tokens go back to each request's asyncio queue (outbox.py); closing the request's iterator
cancels it at the next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from server.config import EngineSettings
from server.engines.base import (
    Engine,
    EngineStats,
    GenerationChunk,
    GenerationRequest,
)
from server.engines.hf.kv.blocks import cache_from_settings
from server.engines.hf.kv.slots import KVSlots
from server.engines.hf.linears.fused import fuse_projections
from server.engines.hf.linears.install import install_linears
from server.engines.hf.linears.prefill_dtype import bf16_prefill_supported, install_bf16_prefill
from server.engines.hf.runner import Runner
from server.engines.hf.scheduler import Scheduler
from server.engines.hf.sequence import SequenceState
from server.errors import EngineDead
from server.families.model_facts import ModelFacts
from server.kvcache.sessions import LookupReport
from server.model_store import resolve_model

log = logging.getLogger(__name__)

# Tokens per prefill forward: bounds activation memory and lets cancellation in between.
# On CUDA small chunks cost a lot (a 32k prefill of an 8B shape: 2.6 s with 1024, 2.2 s with
# 16384 on an H100), so the default there is larger; settings.prefill_chunk_tokens overrides.
PREFILL_CHUNK = 1024
PREFILL_CHUNK_CUDA = 16384


def _device_and_dtype(settings: EngineSettings) -> tuple[torch.device, torch.dtype]:
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but torch sees no CUDA device: use --device cpu")
    cuda = settings.device == "cuda" or (settings.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    if settings.dtype == "auto":
        return device, torch.float32 if device.type == "cpu" else torch.bfloat16
    return device, getattr(torch, settings.dtype)


class HFEngine(Engine):
    name = "hf"

    def __init__(self, settings: EngineSettings, facts: ModelFacts, model: Any = None) -> None:
        """Load ``settings.model``; or wrap an already built ``model`` (random-weight benchmarks).
        ``facts`` (tokenizer, family, end-of-reply ids) were decided before (``load_model_facts``)."""
        self.settings = settings
        self.facts = facts
        if model is None:
            self.device, self.dtype = _device_and_dtype(settings)
            if settings.threads and self.device.type == "cpu":
                torch.set_num_threads(settings.threads)
            path = resolve_model(settings.model)
            t0 = time.perf_counter()
            model = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype)
            model = model.to(self.device).eval()
            log.info(
                "loaded %s on %s (%s) in %.1f s", path, self.device, self.dtype, time.perf_counter() - t0
            )
        else:
            param = next(model.parameters())
            self.device, self.dtype = param.device, param.dtype
        self.tokenizer = facts.tokenizer
        self.model = model
        config = self.model.config
        model_max = int(getattr(config, "max_position_embeddings", 0) or 2048)
        self.max_model_len = min(settings.max_model_len or model_max, model_max)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.eos_token_ids = facts.end_ids
        prefill_chunk = settings.prefill_chunk_tokens or (
            PREFILL_CHUNK_CUDA if self.device.type == "cuda" else PREFILL_CHUNK
        )
        pc = settings.prefix_cache
        self.cache = cache_from_settings(pc, self.device.type)
        # cached_tokens is token-granular (tails, the reply's KV), not a multiple of pc.block_size
        self.block_size = 1
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_error: Exception | None = None  # what stopped the engine thread before its loop
        self._crash: Exception | None = None  # what ended the engine thread's loop (never recovered)
        self._stats = EngineStats()
        # the model's work on sequences (prefill, decode, retain): a part of the engine, not a base
        self.runner = Runner(
            self.model,
            self.device,
            self.cache,
            prefill_chunk,
            self.max_model_len,
            self.vocab_size,
            self._stats,
            # the running sequences' KV side by side (one attention call a decode step), within the
            # KV budget the operator gave the prefix cache (kv/slots.py)
            KVSlots(config, self.dtype, self.device, pc.memory_mb * 2**20),
        )
        self.scheduler = Scheduler(self.runner)  # which sequences run each turn of the engine thread

    @property
    def tokens_generated(self) -> int:
        """All decode steps ever taken (cancellation tests read it)."""
        return self.runner.tokens_generated

    # -- lifecycle --------------------------------------------------------------
    async def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._start_error = None
            ready = threading.Event()
            self._thread = threading.Thread(target=self._loop, args=(ready,), name="hf-engine", daemon=True)
            self._thread.start()
            await asyncio.to_thread(ready.wait)
            if self._start_error is not None:  # e.g. cpu_linears: panel without the kernel
                self._thread = None
                raise RuntimeError(f"the hf engine could not start: {self._start_error}")

    async def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
            self._thread = None

    def health(self) -> str | None:
        """None while the engine can serve; else why not (/health answers 503 with it)."""
        if self._crash is not None:
            return f"the hf engine's decode thread has stopped ({type(self._crash).__name__}: {self._crash})"
        if self._thread is not None and not self._thread.is_alive():
            return "the hf engine's decode thread has stopped"
        return None

    def stats(self) -> EngineStats:
        s = self._stats
        return EngineStats(
            prefix_queries_tokens=s.prefix_queries_tokens,
            prefix_hits_tokens=s.prefix_hits_tokens,
            running=len(self.scheduler.running),
            waiting=self.scheduler.waiting.qsize(),
            extra={**self.cache.stats(), "tokens_generated": float(self.runner.tokens_generated)},
        )

    # -- public API ---------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        if self._thread is None:
            await self.start()
        if (dead := self.health()) is not None:  # nobody would take the request: never a hang
            raise EngineDead(f"{dead}: this worker cannot serve until it is restarted")
        seq = SequenceState(request, asyncio.get_running_loop(), asyncio.Queue())
        seq.stop_ids = frozenset((*self.eos_token_ids, *request.sampling.stop_token_ids))
        # compiled by the caller (chat, at prepare time): nothing compiles here
        seq.constraint = request.constraint.matcher if request.constraint is not None else None
        self.scheduler.add(seq)
        if self._crash is not None:  # the loop ended while this was queued: end it here
            self.scheduler.fail_waiting(self._crash)
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

    def prefill_logits(
        self, prompt_ids: list[int], cache_salt: str = "", session_key: str = ""
    ) -> tuple[torch.Tensor, int]:
        """Next-token logits of a prompt and how many of its tokens came from cache.

        For tests and in-process benchmarks: runs on the calling thread, so call it only
        while no request is being served.
        """
        from server.engines.base import SamplingParams

        seq = SequenceState(
            GenerationRequest("probe", list(prompt_ids), SamplingParams(1), None, cache_salt, session_key),
            None,  # type: ignore[arg-type]  # a probe emits nothing: no loop
            None,  # type: ignore[arg-type]  # and no queue
        )
        with torch.no_grad():
            self.runner.prefill(seq)
        assert seq.next_logits is not None
        return seq.next_logits, seq.cached_tokens

    # -- engine thread -------------------------------------------------------------
    def _loop(self, ready: threading.Event) -> None:
        torch.set_grad_enabled(False)
        try:
            # CPU fp32: the linears on the panel kernel / oneDNN, packed and reordered HERE. The first
            # torch op that runs in parallel on a thread gives it an OpenMP team of its own; with a
            # second team alive (the loading thread's) libgomp counts more threads than cores and stops
            # spinning between parallel regions: a decode step took 54 ms instead of 42 (linears/onednn.py)
            fuse_projections(self.model)  # q/k/v and gate/up: one matmul each (linears/fused.py)
            self._prefill_dtype()  # bfloat16 copies first: the kernels then replace their float32 inner
            install_linears(self.model, self.device, self.dtype, self.settings.cpu_linears)
        except Exception as exc:  # start() raises it: the engine does not serve
            self._start_error = exc
            return
        finally:
            ready.set()
        try:
            while not self._stop.is_set():
                self.scheduler.turn()
                if self.scheduler.idle():
                    if self.runner.slots is not None:
                        self.runner.slots.release_idle()  # idle: an empty pool gives its memory back
                    self._wake.wait(0.5)
                    self._wake.clear()
        except Exception as exc:  # a bug outside one request's step: the engine cannot go on
            self._crash = exc  # first: generate() refuses new requests from now on
            log.critical("the hf engine's decode thread died; every request it held fails", exc_info=exc)
            self.scheduler.fail_all(exc)

    def _prefill_dtype(self) -> None:
        """``engine.prefill_dtype: bfloat16`` on a float32 model: the linears' bfloat16 copies
        (linears/prefill_dtype.py); raises where the device has no native bfloat16 matmul."""
        asked = self.settings.prefill_dtype == "bfloat16"
        if self.dtype != torch.float32:
            if asked:  # a bfloat16/float16 model prefills in its own
                log.info("prefill_dtype: bfloat16 changes nothing: the model already runs in %s", self.dtype)
            return
        if not asked:
            if bf16_prefill_supported(self.device) is None:
                hint = "prefill_dtype: bfloat16 would prefill faster (~2x on an AMX CPU; docs/configure.md)"
                log.info("this %s has native bfloat16: %s", self.device.type, hint)
            return
        added = install_bf16_prefill(self.model, self.device)
        log.info("prefill in bfloat16, decode in float32: %.0f MB of bfloat16 weight copies", added / 2**20)

    def request_arrived(self, session_key: str) -> None:
        """The service says a request of the session arrived (it may still wait for a slot)."""
        if session_key:
            self.cache.request_arrived(session_key)

    def reply_finished(self, session_key: str, tool_names: Sequence[str] = ()) -> None:
        """The service says what the session's reply ended with: tool calls (named) or text."""
        self.cache.reply_finished(session_key, tuple(tool_names))

    def retention_hints(self) -> str | None:
        """Used by the ``session`` policy (``SessionRecord.keep_s``); not by ``lru`` or with no cache."""
        return self.settings.prefix_cache.hint_unused("blocks")

    @property
    def cache_tiers(self) -> tuple[str, ...]:
        """The prefix cache's tiers, first to last (for cache-miss reasons)."""
        return self.cache.tier_names(self.device.type)

    def lookup_report(self, session_key: str) -> LookupReport | None:
        """The prefix-cache lookup of the session's latest request (for cache-miss reasons)."""
        return self.cache.last_lookup(session_key)
