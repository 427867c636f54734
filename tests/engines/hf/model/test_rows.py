"""Batched decode in the hf engine: every running request advances in one forward per step.

Each request must behave exactly as it does alone: the same tokens at temperature 0 (and
logprobs within fp32 rounding) whatever else runs beside it, requests joining and leaving
mid-stream, a cancelled request leaving the others untouched, and a long prefill stalling
the others' decode by at most one chunk.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from server.engines.base import GenerationRequest, SamplingParams
from server.engines.hf import runner
from server.engines.hf.kv.growing import cache_kw, growing_cache
from server.engines.hf.model.rows import decode_rows

pytestmark = pytest.mark.e2e

TOLERANCE = 1e-4  # fp32 on CPU: batched matmuls split differently from single-row ones


def chat_ids(tokenizer, text):
    return tokenizer(
        f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )["input_ids"]


def test_decode_rows_equals_each_sequence_alone(hf_engine, tokenizer):
    model = hf_engine.model
    texts = ["Hello there", "The capital of France is a city that " * 5, "def f(x):\n    return"]

    def prefilled(text):
        kv = growing_cache(model.config)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]), **cache_kw(model, kv), use_cache=True, logits_to_keep=1)
        return kv

    tokens = [17, 42, 1000]
    with torch.no_grad():
        alone = []
        for text, token in zip(texts, tokens, strict=True):
            out = model(input_ids=torch.tensor([[token]]), **cache_kw(model, prefilled(text)), use_cache=True)
            alone.append(out.logits[0, -1])
        caches = [prefilled(t) for t in texts]
        lengths = [c.get_seq_length() for c in caches]
        rows = decode_rows(model, caches, tokens, torch.device("cpu"))
    assert len(set(lengths)) == 3  # different lengths in one batch
    assert [c.get_seq_length() for c in caches] == [n + 1 for n in lengths]  # each grew by one
    for i, logits in enumerate(alone):
        assert torch.max(torch.abs(rows[i] - logits)).item() < TOLERANCE


async def _run(engine, request, delay=0.0, out=None, stop_after=None):
    await asyncio.sleep(delay)
    tokens, logprobs = [], []
    gen = engine.generate(request)
    async for chunk in gen:
        tokens.extend(chunk.token_ids)
        logprobs.extend(lp.logprob for lp in chunk.logprobs or [])
        if out is not None:
            out.append((request.request_id, len(tokens)))
        if stop_after is not None and len(tokens) >= stop_after:
            await gen.aclose()
            break
    return tokens, logprobs


def _requests(tokenizer, tag):
    base = SamplingParams(20, 0.0, logprobs=0)
    return [
        GenerationRequest(f"{tag}-plain", chat_ids(tokenizer, "Tell me about cats."), base, None, tag),
        GenerationRequest(
            f"{tag}-long",
            chat_ids(tokenizer, "Explain gravity in one line. " * 40),
            dataclasses.replace(base, max_tokens=14, frequency_penalty=0.8, presence_penalty=0.3),
            None,
            tag,
        ),
        GenerationRequest(
            f"{tag}-bias",
            chat_ids(tokenizer, "List three colors."),
            dataclasses.replace(base, logit_bias=((28, 5.0), (30, -100.0)), repetition_penalty=1.3),
            None,
            tag,
        ),
        GenerationRequest(
            f"{tag}-stop",
            chat_ids(tokenizer, "Count from 1 to 20."),
            dataclasses.replace(base, stop_token_ids=(28,)),
            None,
            tag,
        ),
    ]


def test_batched_requests_equal_alone_and_run_in_one_forward(hf_engine, tokenizer, monkeypatch):
    widths: list[int] = []
    real = runner.decode_rows

    def spy(model, caches, tokens, *args):
        widths.append(len(tokens))
        return real(model, caches, tokens, *args)

    monkeypatch.setattr(runner, "decode_rows", spy)

    async def run():
        alone = [await _run(hf_engine, r) for r in _requests(tokenizer, "alone")]
        # together, and joining mid-stream (staggered starts)
        together = await asyncio.gather(
            *(_run(hf_engine, r, delay=0.15 * i) for i, r in enumerate(_requests(tokenizer, "both")))
        )
        return alone, together

    alone, together = asyncio.run(run())
    assert all(tokens for tokens, _ in alone)
    assert [t for t, _ in together] == [t for t, _ in alone]
    for (_, lp_alone), (_, lp_together) in zip(alone, together, strict=True):
        assert max(abs(a - b) for a, b in zip(lp_alone, lp_together, strict=True)) < TOLERANCE
    assert widths and max(widths) >= 3  # the running requests shared forwards


def test_cancelling_one_request_leaves_the_others_untouched(hf_engine, tokenizer):
    async def run():
        reqs = _requests(tokenizer, "cancel")
        alone = await _run(hf_engine, _requests(tokenizer, "cancel-alone")[0])
        results = await asyncio.gather(_run(hf_engine, reqs[0]), _run(hf_engine, reqs[2], stop_after=3))
        await asyncio.sleep(0.3)
        return alone, results, hf_engine.stats().running

    alone, (kept, cut), running = asyncio.run(run())
    assert kept[0] == alone[0]
    assert len(cut[0]) == 3 and running == 0


def test_a_long_prefill_stalls_running_decodes_by_one_chunk_at_most(hf_engine, tokenizer, monkeypatch):
    monkeypatch.setattr(hf_engine.runner, "chunk_tokens", 64)
    events: list[str] = []  # on the engine thread, in order
    real_chunk, real_pick = hf_engine.runner.prefill_forward, hf_engine.runner.pick

    def chunk(seqs, chunks):
        if any(seq.request.request_id == "late-long" for seq in seqs):
            events.append("chunk")
        return real_chunk(seqs, chunks)

    def pick(seq):
        if seq.request.request_id == "early":
            events.append("pick")
        return real_pick(seq)

    monkeypatch.setattr(hf_engine.runner, "prefill_forward", chunk)
    monkeypatch.setattr(hf_engine.runner, "pick", pick)
    early = GenerationRequest(
        "early", chat_ids(tokenizer, "Write a story."), SamplingParams(400, 0.0), None, "x"
    )
    long = GenerationRequest(
        "late-long", chat_ids(tokenizer, "Summarise this. " * 120), SamplingParams(2, 0.0), None, "y"
    )

    async def run():
        running = asyncio.create_task(_run(hf_engine, early))
        await _run(hf_engine, long, delay=0.3)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)

    asyncio.run(run())
    chunks = [i for i, e in enumerate(events) if e == "chunk"]
    assert len(chunks) >= 5  # the long prompt took several chunks
    between = [events[a:b].count("pick") for a, b in zip(chunks, chunks[1:], strict=False)]
    assert between == [1] * len(between)  # one decode step of the running request per chunk


def test_decode_attention_leaves_out_cudnn_sdpa_on_cuda_only():
    """cuDNN SDPA builds a plan per KV length (3.7 ms of host time per call on an H100): never in decode."""
    from server.engines.hf.model.rows import decode_attention

    cuda = torch.backends.cuda
    before = cuda.cudnn_sdp_enabled()
    with decode_attention(torch.device("cuda")):
        assert not cuda.cudnn_sdp_enabled()
        assert cuda.flash_sdp_enabled() and cuda.mem_efficient_sdp_enabled() and cuda.math_sdp_enabled()
    assert cuda.cudnn_sdp_enabled() == before
    with decode_attention(torch.device("cpu")):
        assert cuda.cudnn_sdp_enabled() == before


class _Sink:
    """The request's loop and queue for a test that drives the engine's turns itself."""

    def call_soon_threadsafe(self, fn, chunk):
        assert chunk.error is None, chunk.error

    def put_nowait(self, chunk):
        pass
