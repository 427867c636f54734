"""Shared-prefix attention: a pooled step reads the prefix its rows share once, and each row's
logits stay what they are alone (fp32 rounding); rows of different tenants, too few rows or
too short a prefix take the plain pooled path.
"""

from __future__ import annotations

import asyncio
import gc

import pytest
import torch

from server.engines.base import GenerationRequest, SamplingParams
from server.engines.hf.kv.growing import cache_kw, growing_cache
from server.engines.hf.kv.slots import KVSlots, PooledStep
from server.engines.hf.model import rows as model_rows
from server.engines.hf.model import shared_prefix
from server.engines.hf.model.rows import decode_rows
from server.engines.hf.model.shared_prefix import common_prefix, worth_sharing
from tests.kvcache.helpers import tiny_model

CPU = torch.device("cpu")
TOLERANCE = 1e-4
PREFIX = 420  # 4 rows: 3 x 420 >= MIN_SAVED


@pytest.fixture(scope="module")
def model():
    return tiny_model(300)


@pytest.fixture
def steps(monkeypatch):
    """The PooledSteps decode_rows built, and how many layers took the shared-prefix attention."""
    taken: list[PooledStep] = []
    calls: list[int] = []
    real_init, real_attention = PooledStep.__init__, shared_prefix.shared_prefix_attention

    def spy_init(self, *args):
        real_init(self, *args)
        taken.append(self)

    def spy_attention(*args):
        calls.append(1)
        return real_attention(*args)

    monkeypatch.setattr(PooledStep, "__init__", spy_init)
    monkeypatch.setattr(model_rows, "shared_prefix_attention", spy_attention)
    return taken, calls


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _cache(model, ids: list[int], pool: KVSlots | None = None):
    kv = growing_cache(model.config)
    if pool is not None:
        assert pool.admit(kv, len(ids) + 64) is not None
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), **cache_kw(model, kv), use_cache=True)
    return kv


def _alone(model, ids: list[int], token: int) -> torch.Tensor:
    kv = _cache(model, ids)
    with torch.no_grad():
        return model(input_ids=torch.tensor([[token]]), **cache_kw(model, kv), use_cache=True).logits[0, -1]


def test_the_common_prefix_is_the_tokens_every_prompt_starts_with_within_one_tenant():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 3], [1, 2, 9, 4]], ["", "", ""]) == 2
    assert common_prefix([[1, 2, 3], [1, 2, 3]], ["a", "a"]) == 3
    assert common_prefix([[1, 2, 3], [1, 2, 3]], ["a", "b"]) == 0  # two tenants never share
    assert common_prefix([[5, 2], [1, 2]], ["", ""]) == 0
    assert common_prefix([], []) == 0


def test_sharing_pays_only_with_enough_rows_and_prefix():
    assert worth_sharing(4, 400) and worth_sharing(8, 200) and worth_sharing(16, 80)
    assert not worth_sharing(2, 5000)  # two rows never gained (measured)
    assert not worth_sharing(4, 300) and not worth_sharing(8, 100)


def test_a_step_sharing_a_prefix_equals_each_row_alone_with_gaps_and_padding(model, steps):
    taken, calls = steps
    pool = KVSlots(model.config, torch.float32, CPU, 2**26)
    prefix = _ids(PREFIX, 0)
    prompts = [prefix + _ids(n, seed) for n, seed in [(9, 1), (30, 2), (5, 3), (17, 4), (22, 5)]]
    caches = [_cache(model, ids, pool) for ids in prompts]  # each computed its own copy of the prefix
    del caches[1], prompts[1]  # a gap at slot 1
    gc.collect()
    pool.collect()
    order = [3, 0, 2, 1]  # and not in slot order
    batch, tokens = [caches[i] for i in order], [11, 12, 13, 14]
    shared = common_prefix([prompts[i] for i in order], [""] * 4)
    assert shared == PREFIX
    with torch.no_grad():
        rows = decode_rows(model, batch, tokens, CPU, pool, shared)
    assert len(taken) == 1 and taken[0].shared == PREFIX and not taken[0].identity
    assert taken[0].mask is not None  # rows of different lengths: padding past the prefix
    assert len(calls) == model.config.num_hidden_layers
    for row, i, token in zip(rows, order, tokens, strict=True):
        assert torch.max(torch.abs(row - _alone(model, prompts[i], token))).item() < TOLERANCE


def test_too_few_rows_or_too_short_a_prefix_take_the_plain_pooled_step(model, steps):
    taken, calls = steps
    pool = KVSlots(model.config, torch.float32, CPU, 2**26)
    prefix = _ids(PREFIX, 0)
    caches = [_cache(model, prefix + _ids(8, seed), pool) for seed in range(4)]
    with torch.no_grad():
        decode_rows(model, caches[:3], [1, 2, 3], CPU, pool, PREFIX)  # 3 rows
        decode_rows(model, caches, [1, 2, 3, 4], CPU, pool, 100)  # 3 x 100 < MIN_SAVED
        decode_rows(model, caches, [1, 2, 3, 4], CPU, pool, PREFIX)
    assert [s.shared for s in taken] == [0, 0, PREFIX]
    assert len(calls) == model.config.num_hidden_layers


def test_the_engine_shares_a_common_system_prompt_and_gives_the_tokens_of_alone(hf_engine, tokenizer, steps):
    taken, _ = steps
    system = "You are a careful agent. Follow the tools' rules. " * 40
    sys_ids = tokenizer(f"<|im_start|>system\n{system}<|im_end|>\n", add_special_tokens=False)["input_ids"]

    def request(i: int, salt: str = "") -> GenerationRequest:
        text = f"<|im_start|>user\nSession {i}: name robot number {i}.<|im_end|>\n<|im_start|>assistant\n"
        ids = sys_ids + tokenizer(text, add_special_tokens=False)["input_ids"]
        return GenerationRequest(f"share-{i}", ids, SamplingParams(10 + i, 0.0), None, salt)

    async def tokens(req):
        return [t async for chunk in hf_engine.generate(req) for t in chunk.token_ids]

    async def run():
        alone = [await tokens(request(i)) for i in range(5)]
        together = await asyncio.gather(*(tokens(request(i)) for i in range(5)))
        return alone, together

    alone, together = asyncio.run(run())
    assert together == alone
    assert any(s.shared >= len(sys_ids) for s in taken)  # the running requests read the system prompt once
