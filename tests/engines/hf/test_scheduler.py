"""The hf engine's scheduler: what a prefill turn admits and what waits for the next turn."""

from __future__ import annotations

import pytest
import torch

from server.engines.base import GenerationRequest, SamplingParams
from server.engines.hf.engine import HFEngine
from server.engines.hf.sequence import SequenceState
from tests.engines.hf.model.test_rows import _Sink, chat_ids

pytestmark = pytest.mark.e2e


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
def test_a_burst_of_short_prompts_joins_in_one_turn_and_a_long_one_takes_the_rest_of_the_chunk(
    hf_engine, tokenizer
):
    engine = HFEngine(hf_engine.settings, hf_engine.facts, model=hf_engine.model)  # no thread
    scheduler = engine.scheduler  # its turns by hand
    params = SamplingParams(4, 0.0)
    short = [chat_ids(tokenizer, f"Sub-agent {i}: list the files.") for i in range(3)]
    long = chat_ids(tokenizer, "Summarise this paragraph. " * 300)
    assert len(long) > engine.runner.chunk_tokens
    for i, ids in enumerate([*short, long]):
        scheduler.add(SequenceState(GenerationRequest(f"b{i}", ids, params, None, f"b{i}"), _Sink(), _Sink()))
    forwards: list[list[str]] = []
    real = engine.runner.prefill_forward

    def spy(seqs, chunks):
        forwards.append([s.request.request_id for s in seqs])
        return real(seqs, chunks)

    engine.runner.prefill_forward = spy
    with torch.no_grad():
        rest = scheduler.prefill_turn()
        assert [s.request.request_id for s in scheduler.running] == ["b0", "b1", "b2"]  # one turn
        assert forwards == [["b0", "b1", "b2", "b3"]]  # in ONE forward, with the long prompt's first chunk
        assert rest is not None and rest.request.request_id == "b3"
        spent = sum(len(s.request.prompt_ids) - s.cached_tokens for s in scheduler.running)
        assert spent + rest.prefill_at - rest.cached_tokens == engine.runner.chunk_tokens
        assert scheduler.prefilling is rest
        assert scheduler.prefill_turn() is None  # the rest of the long prompt, next turn
        assert forwards[1:] == [["b3"]]
    assert [s.request.request_id for s in scheduler.running] == ["b0", "b1", "b2", "b3"]
