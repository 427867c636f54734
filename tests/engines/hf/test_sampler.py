"""TokenSampler and the sampling filters on hand-made logits (no model): each parameter's effect."""

from __future__ import annotations

import logging

import pytest
import torch

from server.chat.sampling import check_fields, parse_logit_bias
from server.engines.base import SamplingParams
from server.engines.hf.sampler import TokenSampler, candidates, sample_rows, token_logprobs
from server.errors import InvalidRequest
from server.protocol import ChatCompletionRequest

V = 8
CPU = torch.device("cpu")


def sampler(prompt=(), **kw) -> TokenSampler:
    return TokenSampler(SamplingParams(16, **kw), list(prompt), V, CPU)


def row(*values: float) -> torch.Tensor:
    return torch.tensor([list(values)], dtype=torch.float32)


def test_logit_bias_adds_to_the_named_tokens_only():
    s = sampler(logit_bias=((1, -100.0), (3, 2.5)))
    out = s.process(row(1, 2, 3, 4, 5, 6, 7, 8))
    assert out.tolist() == [[1, -98, 3, 6.5, 5, 6, 7, 8]]


def test_frequency_and_presence_penalties_count_generated_tokens():
    s = sampler(prompt=[5, 5, 5], frequency_penalty=0.5, presence_penalty=1.0)
    assert s.process(row(*[0.0] * V)).tolist() == [[0.0] * V]  # the prompt does not count
    for t in (2, 2, 2, 4):
        s.observe(t)
    out = s.process(row(*[0.0] * V))[0]
    assert out[2].item() == pytest.approx(-(3 * 0.5 + 1.0))
    assert out[4].item() == pytest.approx(-(0.5 + 1.0))
    assert out[5].item() == 0.0 and out[0].item() == 0.0


def test_repetition_penalty_covers_prompt_and_output_in_vllm_form():
    s = sampler(prompt=[0, 1], repetition_penalty=2.0)
    s.observe(2)
    out = s.process(row(4, -4, 4, 4, -4, 0, 0, 0))[0].tolist()
    # seen tokens: positive logits divided, negative multiplied; unseen untouched
    assert out[:5] == [2.0, -8.0, 2.0, 4.0, -4.0]


def test_a_bias_cannot_lift_a_masked_token():
    """The mask goes after bias + penalties: -inf stays -inf whatever the bias or penalty."""
    s = sampler(logit_bias=((3, 100.0),), repetition_penalty=1.5, frequency_penalty=-2.0)
    s.observe(3)
    logits = s.process(row(0, 0, 0, 0, 0, 0, 0, 0))
    logits[0, 3] = float("-inf")  # what the MaskApplier writes for a disallowed token
    again = s.process(logits)  # a second pass must not lift it either
    assert again[0, 3].item() == float("-inf")
    assert s.sample(again[0]) != 3


def kept(probs: torch.Tensor, top_k: int, top_p: float, min_p: float) -> set[int]:
    values, ids = candidates(probs, top_k, top_p, min_p)
    ids = torch.arange(len(probs)) if ids is None else ids
    return set(ids[values > 0].tolist())


def test_top_k_min_p_top_p_filters():
    probs = torch.tensor([0.1, 0.4, 0.2, 0.3])
    assert kept(probs, 2, 1.0, 0.0) == {1, 3}
    assert kept(probs, 0, 1.0, 0.5) == {1, 2, 3}  # p >= 0.2
    assert kept(probs, 0, 0.65, 0.0) == {1, 3}
    assert kept(probs, 0, 0.75, 0.0) == {1, 2, 3}
    assert kept(probs, 3, 0.65, 0.0) == {1, 3}  # top_k then top_p
    assert kept(probs, 0, 1.0, 0.0) == {0, 1, 2, 3}
    assert kept(probs, 0, 0.01, 0.0) == {1}  # always at least the top token


def test_top_k_1_at_temperature_1_is_greedy_and_a_seed_reproduces():
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    gen = [torch.Generator().manual_seed(s) for s in range(20)]
    free = [sample_rows(logits, [SamplingParams(1, 1.0)], [g])[0] for g in gen]
    assert len(set(free)) > 1  # precondition: plain sampling varies
    top1 = [sample_rows(logits, [SamplingParams(1, 1.0, top_k=1)], [g])[0] for g in gen]
    assert set(top1) == {int(logits.argmax())}
    seeded = [torch.Generator().manual_seed(7) for _ in range(3)]
    a = [sample_rows(logits, [SamplingParams(1, 1.0)], [g])[0] for g in seeded]
    assert len(set(a)) == 1


def test_token_logprobs_are_the_raw_log_softmax():
    raw = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    (lp,) = token_logprobs(raw, [0], 2)
    ref = torch.log_softmax(raw[0], -1)
    assert lp.logprob == pytest.approx(ref[0].item())
    assert [t for t, _ in lp.top] == [2, 1]
    assert [v for _, v in lp.top] == pytest.approx([ref[2].item(), ref[1].item()])


@pytest.mark.parametrize(
    "bias",
    [{"x": 1}, {"-1": 1}, {str(V): 1}, {"1": 101}, {"1": -100.5}, {"1": "a"}, {"1": float("nan")}, {"1.": 0}],
)
def test_bad_logit_bias_is_a_400_naming_it(bias):
    with pytest.raises(InvalidRequest) as info:
        parse_logit_bias(bias, V)
    assert info.value.param == "logit_bias"


def test_logit_bias_keys_are_token_id_strings():
    assert parse_logit_bias({"3": -100, "1": 100, "0": 0.5}, V) == ((0, 0.5), (1, 100.0), (3, -100.0))


def test_unknown_fields_are_logged_once_per_name(caplog):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "zz_unknown_field": 1, "store": 1}
    with caplog.at_level(logging.WARNING, logger="server.chat.sampling"):
        for _ in range(3):
            check_fields(ChatCompletionRequest(**body))
    hits = [r for r in caplog.records if "zz_unknown_field" in r.getMessage()]
    assert len(hits) == 1
    assert not [r for r in caplog.records if "'store'" in r.getMessage()]


@pytest.mark.parametrize(
    ("field", "value"), [("functions", [{"name": "f"}]), ("function_call", "auto"), ("best_of", 2)]
)
def test_refused_fields_are_400s_naming_them(field, value):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], field: value}
    with pytest.raises(InvalidRequest) as info:
        check_fields(ChatCompletionRequest(**body))
    assert info.value.param == field
