"""Every OpenAI sampling parameter works end to end on the hf engine (embedded model), or is a 400.

Effects asserted against the model itself: a logit_bias of -100 bans the greedy token;
logprobs equal a log-softmax of the engine's logits; a frequency penalty ends a loop that
greedy decoding stays in; a seed reproduces; top_logprobs stream; the mask still wins over
a +100 bias.
"""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from server.constrain.vocab import vocab_of

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
HI = [{"role": "user", "content": "Say hi to the team."}]
LOOP = "1, 1, 1, 1, 1, 1,"  # greedy continues " 1, 1, 1, ..." forever


def chat(url, messages=HI, **kw):
    body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0, **kw}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=300)


def complete(url, prompt, **kw):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0, **kw}
    return httpx.post(url + "/v1/completions", json=body, timeout=300)


def token_id(hf_engine, entry) -> int:
    ids = vocab_of(hf_engine.tokenizer, hf_engine.vocab_size).by_bytes[bytes(entry["bytes"])]
    assert len(ids) == 1
    return ids[0]


def prompt_ids(url, messages) -> list[int]:
    r = httpx.post(url + "/tokenize", json={"model": MODEL, "messages": messages}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_logprobs_equal_the_log_softmax_of_the_models_logits(server_url, hf_engine):
    r = chat(server_url, max_tokens=4, logprobs=True, top_logprobs=5)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == r.json()["usage"]["completion_tokens"] == 4
    ids = prompt_ids(server_url, HI)
    # The reference prefills prompt + reply so far in one forward; the server decoded token by token
    # over a KV pool whose padding depends on earlier requests. Those two fp32 paths differ by up to
    # ~1.5e-4 in logprob on this model (seen: 1.0e-4 and 1.5e-4 in main-suite runs, a flaky failure
    # at abs=1e-4); a wrong distribution (biased, penalised, tempered, off by a token) is off by far more.
    tol = 5e-4
    for entry in content:
        logits, _ = hf_engine.prefill_logits(ids, cache_salt="logprob-reference")
        ref = torch.log_softmax(logits.float(), dim=-1)
        tid = token_id(hf_engine, entry)
        assert entry["logprob"] == pytest.approx(ref[tid].item(), abs=tol)
        values, top_ids = torch.topk(ref, 5)
        assert [token_id(hf_engine, t) for t in entry["top_logprobs"]] == top_ids.tolist()
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(values.tolist(), abs=tol)
        assert entry["token"] == bytes(entry["bytes"]).decode("utf-8", "replace")
        ids = ids + [tid]


def test_a_logit_bias_of_minus_100_bans_the_greedy_token(server_url, hf_engine):
    plain = chat(server_url, max_tokens=3, logprobs=True, top_logprobs=3).json()["choices"][0]
    first = token_id(hf_engine, plain["logprobs"]["content"][0])
    banned = chat(server_url, max_tokens=3, logprobs=True, top_logprobs=3, logit_bias={str(first): -100})
    content = banned.json()["choices"][0]["logprobs"]["content"]
    assert first not in [token_id(hf_engine, e) for e in content]
    assert banned.json()["choices"][0]["message"]["content"] != plain["message"]["content"]
    # logprobs stay the model's raw distribution (vLLM's default), not the biased one: the
    # banned token is still the most likely there
    assert content[0]["top_logprobs"] == plain["logprobs"]["content"][0]["top_logprobs"]


def test_a_frequency_penalty_ends_a_greedy_loop(server_url):
    def loops(text: str) -> bool:
        return {part.strip() for part in text.split(",")} <= {"1", ""}

    looped = complete(server_url, LOOP).json()["choices"][0]["text"]
    assert loops(looped), looped  # precondition: greedy loops
    for field in ("frequency_penalty", "repetition_penalty"):
        text = complete(server_url, LOOP, **{field: 2.0}).json()["choices"][0]["text"]
        assert not loops(text), (field, text)


def test_a_seed_reproduces_a_sampled_reply(server_url):
    def sample(seed):
        r = chat(server_url, max_tokens=8, temperature=1.0, seed=seed)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    a, b = sample(11), sample(11)
    assert a == b
    assert len({a, sample(12), sample(13), sample(14)}) > 1


def test_top_k_1_and_min_p_1_sample_the_greedy_reply(server_url):
    greedy = chat(server_url, max_tokens=8).json()["choices"][0]["message"]["content"]
    for kw in ({"top_k": 1}, {"min_p": 1.0}):
        for seed in (1, 2):
            r = chat(server_url, max_tokens=8, temperature=1.5, seed=seed, **kw)
            assert r.json()["choices"][0]["message"]["content"] == greedy, kw


def test_top_logprobs_in_a_stream_equal_the_non_streamed_ones(server_url):
    full = chat(server_url, max_tokens=6, logprobs=True, top_logprobs=3).json()["choices"][0]["logprobs"]
    body = {
        "model": MODEL,
        "messages": HI,
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
        "logprobs": True,
        "top_logprobs": 3,
    }
    entries = []
    with httpx.stream("POST", server_url + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                entries += (choice.get("logprobs") or {}).get("content") or []
    assert [e["token"] for e in entries] == [e["token"] for e in full["content"]]
    assert [e["logprob"] for e in entries] == pytest.approx([e["logprob"] for e in full["content"]], abs=1e-5)
    assert all(len(e["top_logprobs"]) == 3 for e in entries)


def test_completions_logprobs_use_the_legacy_shape(server_url):
    r = complete(server_url, "The capital of France is", max_tokens=3, logprobs=2)
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 3
    assert "".join(lp["tokens"]) == r.json()["choices"][0]["text"]
    assert all(len(t) == 2 for t in lp["top_logprobs"])


def test_the_tool_mask_wins_over_a_plus_100_bias(server_url, tokenizer):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "shell_exec",
                "parameters": {
                    "type": "object",
                    "properties": {"cmd": {"type": "string"}},
                    "required": ["cmd"],
                },
            },
        }
    ]
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")  # never allowed inside a call
    msgs = [{"role": "user", "content": "List the files"}]
    free = chat(server_url, msgs, max_tokens=2, logit_bias={str(start): 100}).json()["choices"][0]
    assert free["message"]["content"] == "<|im_start|>" * 2  # precondition: the bias is in force
    bias = {str(start): 100}
    r = chat(server_url, msgs, max_tokens=40, tools=tools, tool_choice="required", logit_bias=bias)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "shell_exec" and isinstance(json.loads(call["arguments"])["cmd"], str)


def test_max_completion_tokens_bounds_the_reply(server_url):
    r = chat(server_url, max_completion_tokens=3, max_tokens=50)
    assert r.json()["usage"]["completion_tokens"] == 3 and r.json()["choices"][0]["finish_reason"] == "length"
    # over the window: lowered to what remains under the default limits.max_tokens_over_window: clamp
    # (a stop string ends the reply early; reject's 400 is tests/e2e/test_max_tokens_window.py)
    r = chat(server_url, max_completion_tokens=10**6, stop=[" ", "\n", ".", ","])
    assert r.status_code == 200, r.text
    clamped = r.json()["max_tokens_clamped"]
    assert clamped["requested"] == 10**6 and 0 < clamped["granted"] < 8192


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logit_bias": {"hello": 5}}, "logit_bias"),
        ({"logit_bias": {"10000000": 5}}, "logit_bias"),
        ({"logit_bias": {"5": 200}}, "logit_bias"),
        ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"top_k": -2}, "top_k"),
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"n": 2}, "n"),
    ],
)
def test_a_bad_or_refused_parameter_is_a_400_naming_it(server_url, extra, param):
    r = chat(server_url, **extra)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err
