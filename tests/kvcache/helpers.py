"""Shared by the KV cache tests: a random-weight tiny Llama that runs on CPU in milliseconds.

Its outputs are meaningless; what the tests check is that reused KV gives the logits of a
from-scratch prefill, which holds for any weights.
"""

from __future__ import annotations

from typing import Any


def tiny_model(vocab_size: int, max_positions: int = 4096, seed: int = 0) -> Any:
    """A 2-layer Llama with random fp32 weights on CPU (the tokenizer is the test's business)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
