"""Token-granular reuse: the previous prompt's tail and the generated reply's KV serve the next turn.

A random-weight tiny Llama (fp32, CPU, milliseconds) inside the real HFEngine: every
reused token must give the logits of a from-scratch prefill (1e-4).
"""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

from server.config import load_settings  # noqa: E402
from server.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from server.engines.hf.engine import HFEngine  # noqa: E402
from server.families.model_facts import facts_of_model  # noqa: E402
from tests.kvcache.helpers import tiny_model  # noqa: E402

TOL = 1e-4
VOCAB = 512


def make_engine(model, **pc):
    cfg = {"block_size": 16, "memory_mb": 64, **pc}
    settings = load_settings(prefix_cache=cfg, max_model_len=4096, device="cpu")
    return HFEngine(settings, facts_of_model(settings, None, model), model=model)


@pytest.fixture(scope="module")
def model():
    m = tiny_model(VOCAB, max_positions=4096)
    m.generation_config.eos_token_id = None  # never stop early: generate exactly max_tokens
    return m


def ids_of(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % VOCAB for i in range(n)]


def scratch_logits(model, ids):
    off = make_engine(model, enabled=False)
    logits, cached = off.prefill_logits(ids)
    assert cached == 0
    return logits


async def generate(engine, ids, max_tokens, session="", salt=""):
    req = GenerationRequest("r", list(ids), SamplingParams(max_tokens, 0.0), None, salt, session)
    out: list[int] = []
    async for chunk in engine.generate(req):
        out.extend(chunk.token_ids)
    await engine.shutdown()
    return out


def test_next_turn_reuses_the_whole_prompt_and_the_reply(model):
    eng = make_engine(model)
    prompt = ids_of(1, 150)  # 9 full blocks + a 6-token tail
    reply = asyncio.run(generate(eng, prompt, 21, session="s1"))
    assert len(reply) == 21
    # "length": the last token was emitted but never run through the model, so its KV does not exist
    kv_tokens = len(prompt) + len(reply) - 1
    nxt = prompt + reply + ids_of(2, 20)
    logits, cached = eng.prefill_logits(nxt)
    assert cached == kv_tokens  # before: only 160 (the prompt's full blocks)
    assert torch.max(torch.abs(logits - scratch_logits(model, nxt))).item() < TOL


def test_partly_matching_block_and_tail_give_scratch_logits(model):
    eng = make_engine(model)
    prompt = ids_of(3, 100)
    asyncio.run(generate(eng, prompt, 5, session="s"))
    # diverge inside block 4 (tokens 64..79) at token 70
    other = prompt[:70] + ids_of(4, 30)
    logits, cached = eng.prefill_logits(other)
    assert cached == 70
    assert torch.max(torch.abs(logits - scratch_logits(model, other))).item() < TOL
    # a prompt that is a prefix of the cached sequence: all but its last token come from cache
    short = prompt[:90]
    logits, cached = eng.prefill_logits(short)
    assert cached == 89
    assert torch.max(torch.abs(logits - scratch_logits(model, short))).item() < TOL


def test_reply_sent_back_with_a_different_token_split_reuses_up_to_the_split(model):
    eng = make_engine(model)
    prompt = ids_of(5, 40)
    reply = asyncio.run(generate(eng, prompt, 12, session="s"))
    # the client's text re-tokenizes differently from token 6 of the reply on
    nxt = prompt + reply[:6] + [(reply[6] + 1) % VOCAB] + reply[7:] + ids_of(6, 10)
    logits, cached = eng.prefill_logits(nxt)
    assert cached == len(prompt) + 6
    assert torch.max(torch.abs(logits - scratch_logits(model, nxt))).item() < TOL


def test_a_covered_tail_is_dropped_as_a_duplicate(model):
    eng = make_engine(model)
    prompt = ids_of(7, 40)  # 2 full blocks + 8-token tail
    asyncio.run(generate(eng, prompt, 1, session="s"))  # kv = 40 tokens: tail of 8 cached
    blocks_before = len(eng.cache)
    assert blocks_before == 3
    longer = prompt + ids_of(8, 30)  # its block 2 covers the tail
    asyncio.run(generate(eng, longer, 1, session="s"))
    # blocks 0-3 full + a 6-token tail; the old 8-token tail is gone
    assert len(eng.cache) == 5
