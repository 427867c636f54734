"""GrowingLayer: the hf engine's in-place KV cache gives the same logits as transformers' own."""

from __future__ import annotations

import pytest
import torch

from server.engines.hf.kv.blocks import BlockCutter
from server.engines.hf.kv.growing import GrowingLayer, cache_kw, growing_cache


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def _run(model, kv, prompt: torch.Tensor, chunks: int, steps: int) -> list[torch.Tensor]:
    """Prefill in ``chunks`` pieces, then greedy-decode ``steps`` tokens; the logits of every forward."""
    out: list[torch.Tensor] = []
    with torch.no_grad():
        for piece in prompt.tensor_split(chunks, dim=1):
            logits = model(input_ids=piece, **cache_kw(model, kv), use_cache=True).logits
            out.append(logits[0, -1])
        for _ in range(steps):
            token = out[-1].argmax().view(1, 1)
            out.append(model(input_ids=token, **cache_kw(model, kv), use_cache=True).logits[0, -1])
    return out


def test_growing_cache_matches_dynamic_cache_across_regrowths(tiny_model):
    from transformers import DynamicCache

    prompt = torch.randint(0, 512, (1, 300), generator=torch.Generator().manual_seed(1))
    ref_kv = DynamicCache(config=tiny_model.config)
    kv = growing_cache(tiny_model.config)
    assert all(isinstance(layer, GrowingLayer) for layer in kv.layers)
    for layer in kv.layers:
        layer.reserve = 7  # tiny spare room: the 300-token prompt and 40 steps regrow many times
    ref = _run(tiny_model, ref_kv, prompt, 3, 40)
    got = _run(tiny_model, kv, prompt, 3, 40)
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(a, b)
    assert kv.get_seq_length() == ref_kv.get_seq_length() == 340
    for mine, theirs in zip(kv.layers, ref_kv.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys)
        assert mine._k is not None and mine._k.shape[-2] > 340  # room was kept beyond what is filled


def test_block_cutter_reads_the_filled_part_only(tiny_model):
    kv = growing_cache(tiny_model.config)
    prompt = torch.randint(0, 512, (1, 70), generator=torch.Generator().manual_seed(2))
    _run(tiny_model, kv, prompt, 1, 0)
    cutter = BlockCutter(kv, 32)
    assert cutter.n_tokens == 70
    block, _ = cutter(1)
    torch.testing.assert_close(block[0, 0], kv.layers[0].keys[0, :, 32:64])
    tail, _ = cutter(2)
    assert tail.shape[3] == 6  # 70 - 64: no spare-room garbage in the tail


def test_crop_then_append_overwrites_the_cropped_tokens(tiny_model):
    from transformers import DynamicCache

    prompt = torch.randint(0, 512, (1, 50), generator=torch.Generator().manual_seed(3))
    kv, ref_kv = growing_cache(tiny_model.config), DynamicCache(config=tiny_model.config)
    _run(tiny_model, kv, prompt, 1, 0)
    _run(tiny_model, ref_kv, prompt[:, :40], 1, 0)
    kv.crop(-10)  # transformers 5: a negative count of tokens to remove
    assert kv.get_seq_length() == 40
    more = prompt[:, 40:45] + 1  # different tokens where the cropped ones were
    with torch.no_grad():
        got = tiny_model(input_ids=more, **cache_kw(tiny_model, kv), use_cache=True).logits
        ref = tiny_model(input_ids=more, **cache_kw(tiny_model, ref_kv), use_cache=True).logits
    torch.testing.assert_close(got, ref)


def test_restore_then_prefill_and_decode_match_dynamic_cache(tiny_model):
    """The engine's path: a prefix-cache match's stacked KV restored, the rest prefilled, then decoded."""
    from transformers import DynamicCache

    from server.engines.hf.kv.growing import restore

    prompt = torch.randint(0, 512, (1, 120), generator=torch.Generator().manual_seed(4))
    warm = DynamicCache(config=tiny_model.config)
    _run(tiny_model, warm, prompt[:, :100], 1, 0)
    stacked = torch.stack([torch.stack((lay.keys[0], lay.values[0])) for lay in warm.layers])
    ref_kv, kv = DynamicCache(config=tiny_model.config), growing_cache(tiny_model.config)
    restore(ref_kv, stacked)
    restore(kv, stacked)
    assert kv.get_seq_length() == ref_kv.get_seq_length() == 100
    ref = _run(tiny_model, ref_kv, prompt[:, 100:], 2, 10)
    got = _run(tiny_model, kv, prompt[:, 100:], 2, 10)
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(a, b)
