"""Tiny random-weight decoder models of the families the lean decode forward covers (and not)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

SHAPE = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)

# model type -> config fields beyond SHAPE (biases, per-head norms, windows)
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"head_dim": 16},
    "qwen2": {},  # q/k/v with biases
    "qwen3": {"head_dim": 16},  # q/k RMSNorm per head
    "mistral": {"head_dim": 16, "sliding_window": None},
}


def tiny(model_type: str, seed: int = 0, **extra: Any) -> Any:
    """A 2-layer random model of ``model_type`` (fp32, eval), the same weights for the same seed."""
    config = AutoConfig.for_model(model_type, **SHAPE, **{**FAMILIES.get(model_type, {}), **extra})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
