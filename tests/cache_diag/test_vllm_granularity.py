"""On vLLM the report works from what our session table knows plus vLLM's num_cached_tokens.

vLLM caches whole blocks (16 tokens on GPU, 128 on CPU) and recomputes at least the last
token; the service reads the engine's block size (``Engine.block_size``) so the report's
unit is vLLM's, not the hf engine's setting. Simulated here with vLLM's reuse rule.
"""

from __future__ import annotations

from server.cache_diag.fingerprint import common_prefix
from tests.cache_diag.helpers import prompt, run, trace_bodies


def vllm_cached(prev_ids, cur_ids, block):
    """vLLM's num_cached_tokens when the previous prompt's blocks are all still there."""
    return (min(common_prefix(prev_ids, cur_ids), len(cur_ids) - 1) // block) * block


def test_vllm_block_size_gives_no_false_alarm_and_evictions_are_named(tokenizer):
    (bodies,) = trace_bodies("vllm")
    prompts = [prompt(tokenizer, b["messages"], b["tools"]) for b in bodies]
    wrong_unit = 0
    for prev, cur in zip(prompts, prompts[1:], strict=False):
        cached = vllm_cached(prev.ids, cur.ids, 128)
        assert run(prev, cur, cached=cached, block=128).type is None
        wrong_unit += run(prev, cur, cached=cached, block=32).type == "evicted"
        d = run(prev, cur, cached=max(0, cached - 256), block=128, tier="vLLM's KV cache")
        assert d.type == "evicted" and d.detail["tier"] == "vLLM's KV cache"
        assert d.missed_tokens == d.detail["reusable_tokens"] - (cached - 256) > 0
    assert wrong_unit > 0  # measured in the hf engine's 32-token blocks, vLLM's reuse looks like eviction
