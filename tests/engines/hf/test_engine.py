"""The hf engine on the embedded model: cached logits equal scratch logits; no cross-talk."""

from __future__ import annotations

import asyncio

import pytest
import torch

from server.engines.base import GenerationRequest, SamplingParams

pytestmark = pytest.mark.e2e

TOLERANCE = 1e-4  # fp32 on CPU; measured max |diff| is ~1e-5 (different matmul split points)


def prompt_ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_logits_with_cache_reuse_equal_scratch(hf_engine, tokenizer):
    ids = prompt_ids(tokenizer, "The quick brown fox jumps over the lazy dog. " * 30)
    salt = "logits-test"
    bs = hf_engine.cache.block_size
    scratch, cached = hf_engine.prefill_logits(ids, cache_salt=salt)
    assert cached == 0
    longer = ids + prompt_ids(tokenizer, " And then it ran away into the forest.")
    reused, cached = hf_engine.prefill_logits(longer, cache_salt=salt)
    assert cached == (len(ids) // bs) * bs and cached > 0.9 * len(ids)
    hf_engine.cache.enabled = False
    try:
        fresh, none = hf_engine.prefill_logits(longer, cache_salt=salt)
    finally:
        hf_engine.cache.enabled = True
    assert none == 0
    assert torch.max(torch.abs(reused - fresh)).item() < TOLERANCE
    assert torch.argmax(reused) == torch.argmax(fresh)
    # a prompt fully covered by cached blocks still computes its last token
    again, cached = hf_engine.prefill_logits(ids[: (len(ids) // bs) * bs], cache_salt=salt)
    assert cached == (len(ids) // bs) * bs - 1


async def _generate(engine, ids, max_tokens, seed=None, temperature=0.0, salt=""):
    req = GenerationRequest(
        f"r{len(ids)}-{salt}", ids, SamplingParams(max_tokens, temperature, seed=seed), None, salt
    )
    out = []
    async for chunk in engine.generate(req):
        out.extend(chunk.token_ids)
    return out


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
def test_concurrent_sessions_do_not_corrupt_each_other(hf_engine, tokenizer):
    texts = ["Tell me about cats.", "Explain gravity in one line. " * 20, "List three colors."]
    prompts = [
        prompt_ids(tokenizer, f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n") for t in texts
    ]

    async def run():
        alone = [await _generate(hf_engine, p, 12, salt=f"a{i}") for i, p in enumerate(prompts)]
        together = await asyncio.gather(
            *(_generate(hf_engine, p, 12, salt=f"b{i}") for i, p in enumerate(prompts))
        )
        # and again with the prefix cache warm for all three, interleaved
        warm = await asyncio.gather(
            *(_generate(hf_engine, p, 12, salt=f"b{i}") for i, p in enumerate(prompts))
        )
        return alone, together, warm

    alone, together, warm = asyncio.run(run())
    assert all(len(x) > 0 for x in alone)
    assert together == alone and warm == alone


def test_seeded_sampling_is_reproducible(hf_engine, tokenizer):
    ids = prompt_ids(tokenizer, "<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n")

    async def run():
        a = await _generate(hf_engine, ids, 8, seed=7, temperature=1.0)
        b = await _generate(hf_engine, ids, 8, seed=7, temperature=1.0)
        return a, b

    a, b = asyncio.run(run())
    assert a == b


def test_closing_the_stream_cancels_generation(hf_engine, tokenizer):
    ids = prompt_ids(tokenizer, "<|im_start|>user\nWrite a long story.<|im_end|>\n<|im_start|>assistant\n")

    async def run():
        req = GenerationRequest("cancel-me", ids, SamplingParams(500, 0.0), None, "cancel")
        gen = hf_engine.generate(req)
        async for _ in gen:
            break
        await gen.aclose()
        before = hf_engine.tokens_generated
        await asyncio.sleep(0.5)
        return before, hf_engine.tokens_generated, hf_engine.stats().running

    before, after, running = asyncio.run(run())
    assert after - before <= 1 and running == 0


def test_stop_token_ids_and_eos_end_the_reply(hf_engine, tokenizer):
    ids = prompt_ids(tokenizer, "<|im_start|>user\nCount from 1 to 20.<|im_end|>\n<|im_start|>assistant\n")

    async def run(stop_token_ids):
        req = GenerationRequest(
            f"stop-{stop_token_ids}", ids, SamplingParams(12, 0.0, stop_token_ids=stop_token_ids), None, ""
        )
        tokens, finish = [], None
        async for chunk in hf_engine.generate(req):
            tokens.extend(chunk.token_ids)
            finish = chunk.finish_reason or finish
        return tokens, finish

    full, _ = asyncio.run(run(()))
    assert len(full) >= 4
    stop = full[3]
    first = full.index(stop)  # the first time the model writes that token
    cut, finish = asyncio.run(run((stop,)))
    assert cut == full[:first] and finish == "stop"  # the stop token itself is not part of the reply
    assert not set(full) & set(hf_engine.eos_token_ids)  # EOS never reaches the reply either
