"""LlamaCppEngine on the embedded SmolLM2 Q4_1 GGUF: llama.cpp's own greedy tokens, masks, the prefix cache.

Skipped when llama_cpp is not installed (scripts/install_llamacpp.sh). One engine for the module.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama_cpp is not installed: run scripts/install_llamacpp.sh"
)

import jsonschema  # noqa: E402

from server.chat.tool_choice import plan_tools  # noqa: E402
from server.chat.toolcalls import parse_tool_calls  # noqa: E402
from server.config import load_settings  # noqa: E402
from server.constrain.spec import ToolSpec  # noqa: E402
from server.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from server.errors import ContextLengthExceeded  # noqa: E402
from server.families.envelope import load_envelope  # noqa: E402
from server.families.model_facts import load_model_facts  # noqa: E402
from server.families.render import renderer_for  # noqa: E402
from server.model_store import embedded_gguf  # noqa: E402
from server.protocol import ChatMessage  # noqa: E402
from tests.engines.compiled import compiled  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

TOOLS = json.loads((Path(__file__).resolve().parents[2] / "fixtures/prefixed_agent_tools.json").read_text())
SYSTEM = "<|im_start|>system\n" + " ".join(
    f"Rule {i}: read file_{i}.py before editing it." for i in range(40)
)


@pytest.fixture(scope="module")
def engine(loop, embedded_model_dir):
    from server.engines.llamacpp.engine import LlamaCppEngine

    settings = load_settings(None, engine="llamacpp", model="embedded", max_model_len=4096, threads=1)
    eng = LlamaCppEngine(settings.engine_settings(), load_model_facts(settings, "llamacpp"))
    loop.run(eng.start())
    yield eng
    loop.run(eng.shutdown())


async def collect(engine, request):
    return [chunk async for chunk in engine.generate(request)]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0)


def ids_of(engine, text: str) -> list[int]:
    return engine.tokenizer(text, add_special_tokens=False)["input_ids"]


def tokens(chunks) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def chat(text: str) -> str:
    return f"{SYSTEM}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def test_engine_shape(engine):
    assert engine.name == "llamacpp"
    assert engine.vocab_size == 49152 and engine.max_model_len == 4096
    assert 2 in engine.eos_token_ids  # <|im_end|>


def test_a_turn_is_one_graph(engine):
    """A full prompt chunk plus every running row fits one ubatch: llama.cpp does not split a turn."""
    from server.engines.llamacpp.engine import N_SEQ

    ctx = engine.rt.ctx
    assert llama_cpp.llama_n_batch(ctx) == engine.chunk + N_SEQ
    assert llama_cpp.llama_n_ubatch(ctx) == llama_cpp.llama_n_batch(ctx)


def test_the_context_runs_flash_attention_with_every_thread_on_a_prompt(engine):
    """The settings the cold prefill was measured with (issue 39): ggml's CPU flash attention (1.25-1.6x
    the prompt tok/s of the plain path, which also multiplies every idle session's cells) and the
    prompt's decode on as many threads as a step's."""
    p = engine.rt.params
    assert p.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    assert p.n_threads_batch == p.n_threads == 1  # the fixture's threads=1
    assert p.kv_unified


def test_the_tokenizer_is_llama_cpps(engine):
    """/tokenize and usage count with the transformers tokenizer: it must split as llama.cpp does."""
    llm = llama_cpp.Llama(str(embedded_gguf()), n_ctx=64, vocab_only=True, verbose=False)
    text = chat("Hi! Écris `ls -la` puis 3.14159 — done?\n\tok")
    assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids_of(engine, text)


def test_greedy_tokens_equal_llama_cpps_own(engine, loop):
    prompt = ids_of(engine, chat("Write a short poem about the sea."))
    ours = tokens(loop.run(collect(engine, GenerationRequest("g", prompt, greedy(32)))))
    llm = llama_cpp.Llama(
        str(embedded_gguf()), n_ctx=1024, n_batch=512, n_threads=1, flash_attn=True, verbose=False, seed=1
    )
    ref: list[int] = []
    for t in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0):
        if t in engine.eos_token_ids or len(ref) == 32:
            break
        ref.append(t)
    assert len(ours) >= 8
    assert ours == ref


NEAR_TIE = 0.5  # nats between the lone run's two most likely tokens


def agree_until_a_near_tie(alone: list, batched: list[int]) -> bool:
    """``batched`` tokens equal the lone run's, or part only by taking the lone run's runner-up where
    the two best were within ``NEAR_TIE``: a 4-row decode runs other ggml kernels than a 1-row one
    (a matrix product, not a vector one: measured 0.14 nats apart on the AVX-512 build), and where
    the cells sit in the pool changes flash attention's rounding. A row mixed up with another parts
    with a token the lone run did not rank second."""
    for lp, token in zip(alone, batched, strict=False):
        if token != lp.token_id:
            return len(lp.top) > 1 and token == lp.top[1][0] and lp.top[0][1] - lp.top[1][1] < NEAR_TIE
    return len(batched) == len(alone)


def test_a_batch_of_requests_gives_each_its_own_greedy_tokens(engine, loop):
    questions = ["Name three colors.", "What is 2+2?", "Say hello in French.", "List two fruits."]
    prompts = [ids_of(engine, chat(q)) for q in questions]
    scored = SamplingParams(max_tokens=12, temperature=0.0, logprobs=2)
    alone = [
        [
            lp
            for c in loop.run(collect(engine, GenerationRequest(f"a{i}", p, scored)))
            for lp in c.logprobs or []
        ]
        for i, p in enumerate(prompts)
    ]

    async def together():
        return await asyncio.gather(
            *(collect(engine, GenerationRequest(f"b{i}", p, greedy(12))) for i, p in enumerate(prompts))
        )

    batched = [tokens(c) for c in loop.run(together())]
    assert all(len(lps) >= 4 for lps in alone)  # 12, or up to the end of the reply
    assert all(agree_until_a_near_tie(a, b) for a, b in zip(alone, batched, strict=True)), (alone, batched)
    # and a row does not take another's tokens: the four questions are answered differently
    assert len({tuple(b[:4]) for b in batched}) == 4


def test_a_shared_prefix_and_the_next_turn_come_from_cache(engine, loop):
    system = "<|im_start|>system\nYou are the build bot. " + "Check every step twice. " * 30
    shared = len(ids_of(engine, system))

    def prompt(question: str) -> list[int]:
        return ids_of(
            engine, f"{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        )

    before = engine.stats()
    first = prompt("Which file do I read first?")
    a = loop.run(collect(engine, GenerationRequest("t1", first, greedy(6), session_key="s1")))
    assert a[-1].cached_tokens < shared  # this system prompt is new to the cache
    # the same session's next turn: prompt + reply + more, all but the new tokens cached
    reply = tokens(a)
    turn = ids_of(engine, "<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n")
    b = loop.run(collect(engine, GenerationRequest("t2", first + reply + turn, greedy(4), session_key="s1")))
    assert b[-1].cached_tokens >= len(first) + len(reply) - 1
    assert all(c.cached_tokens == b[-1].cached_tokens for c in b)
    # another session with the same system prompt shares it
    other = prompt("Where are the tests?")
    c = loop.run(collect(engine, GenerationRequest("o1", other, greedy(4), session_key="s2")))
    assert c[-1].cached_tokens >= shared - 1
    after = engine.stats()
    assert after.prefix_hits_tokens - before.prefix_hits_tokens >= b[-1].cached_tokens + c[-1].cached_tokens
    # another tenant does not
    d = loop.run(collect(engine, GenerationRequest("o2", other, greedy(4), cache_salt="tenant-b")))
    assert d[-1].cached_tokens == 0
    # and a prefix from cache decodes what a cold one does
    assert tokens(d) == tokens(c)


@pytest.mark.slow  # heavy for the main suite's ~10 min (CI runs it in the slow step)
def test_a_masked_tool_call_is_valid(engine, loop):
    hermes = load_envelope("hermes")
    messages = [ChatMessage(role="user", content="Open the site https://example.org and take a screenshot.")]
    plan = plan_tools(
        TOOLS, "required", [m.model_dump(exclude_none=True) for m in messages], False, None, hermes
    )
    rendered = renderer_for(hermes.name).render(messages, TOOLS)
    prompt = ids_of(engine, rendered.text) + (ids_of(engine, plan.prefill) if plan.prefill else [])
    spec = ToolSpec(TOOLS, plan, "hermes", "xgrammar", engine.eos_token_ids)
    for temperature in (0.0, 1.0):
        sampling = SamplingParams(max_tokens=200, temperature=temperature, seed=7)
        chunks = loop.run(
            collect(engine, GenerationRequest(f"tool{temperature}", prompt, sampling, compiled(engine, spec)))
        )
        assert chunks[-1].finish_reason == "stop" and chunks[-1].error is None, chunks[-1]
        text = plan.prefill + engine.tokenizer.decode(tokens(chunks))
        parsed = parse_tool_calls(text, hermes)
        assert len(parsed.tool_calls) == 1, text
        call = parsed.tool_calls[0]
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.name]
        jsonschema.validate(json.loads(call.arguments), schema)


def test_cancelling_frees_the_slot_and_the_engine_goes_on(engine, loop):
    async def two_then_close():
        gen = engine.generate(GenerationRequest("c", ids_of(engine, chat("Count to 100.")), greedy(200)))
        got = [await gen.__anext__(), await gen.__anext__()]
        await gen.aclose()
        return got

    assert len(loop.run(two_then_close())) == 2
    for _ in range(100):
        if engine.stats().running == 0:
            break
        loop.run(asyncio.sleep(0.05))
    assert engine.stats().running == 0
    done = loop.run(collect(engine, GenerationRequest("after", ids_of(engine, chat("Hi")), greedy(3))))
    assert done[-1].finish_reason in ("length", "stop")


def test_a_prompt_over_the_window_is_a_400(engine, loop):
    with pytest.raises(ContextLengthExceeded) as info:
        loop.run(collect(engine, GenerationRequest("huge", [5] * 5000, greedy(2))))
    assert info.value.status == 400


def test_the_app_on_llamacpp_tool_calls_in_three_dialects_and_tokenize_equals_usage(engine):
    from fastapi.testclient import TestClient

    from server.app import build_app
    from tests.conftest import worker_settings

    settings = worker_settings()
    name = settings.served_model_name
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    tool = {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    with TestClient(build_app(settings, engine=engine)) as c:
        assert c.get("/health").json()["engine"] == "llamacpp"
        tools = [{"type": "function", "function": tool}]
        count = c.post("/tokenize", json={"messages": msgs, "tools": tools}).json()["count"]
        auto = {"model": name, "messages": msgs, "tools": tools, "tool_choice": "auto", "max_tokens": 1}
        assert c.post("/v1/chat/completions", json=auto).json()["usage"]["prompt_tokens"] == count
        body = {"model": name, "messages": msgs, "tools": tools, "tool_choice": "required", "max_tokens": 60}
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["usage"]["prompt_tokens"] > count  # required: the envelope's opening is prefilled
        call = out["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "get_weather" and isinstance(json.loads(call["arguments"])["city"], str)
        anthropic = {
            "model": name,
            "max_tokens": 60,
            "messages": msgs,
            "tools": [{"name": "get_weather", "input_schema": tool["parameters"]}],
            "tool_choice": {"type": "any"},
        }
        r = c.post("/v1/messages", json=anthropic)
        assert r.status_code == 200, r.text
        assert [b["type"] for b in r.json()["content"]][-1] == "tool_use"
        responses = {
            "model": name,
            "input": "Weather in Paris?",
            "tools": [{"type": "function", **tool}],
            "tool_choice": "required",
            "max_output_tokens": 60,
        }
        r = c.post("/v1/responses", json=responses)
        assert r.status_code == 200, r.text
        assert any(item["type"] == "function_call" for item in r.json()["output"])


@pytest.mark.slow  # ~15 s of prefill; the main suite covers the logic on a fake runtime (test_engine_fake.py)
def test_a_session_evicted_from_a_full_pool_comes_back_from_tier_2(loop, embedded_model_dir):
    """A pool of one window (512 cells): a second ~300-token session evicts the first; with
    tier 2 the first one's next turn loads its saved state (llama_state_seq_*) and decodes what a
    cold prompt decodes."""
    from server.engines.llamacpp.engine import LlamaCppEngine

    settings = load_settings(
        None,
        engine="llamacpp",
        model="embedded",
        max_model_len=512,
        threads=1,
        prefix_cache={"memory_mb": 0, "tier2": {"memory_mb": 64}},
    )
    eng = LlamaCppEngine(settings.engine_settings(), load_model_facts(settings, "llamacpp"))
    loop.run(eng.start())
    try:
        first = ids_of(eng, "<|im_start|>user\n" + "Which file do I read first? " * 40)
        a = loop.run(collect(eng, GenerationRequest("a", first, greedy(4), session_key="a")))
        other = ids_of(eng, "<|im_start|>user\n" + "Where are the tests? " * 50)
        loop.run(collect(eng, GenerationRequest("b", other, greedy(4), session_key="b")))
        assert len(first) + len(other) > eng.rt.n_ctx  # the second evicted the first
        nxt = first + tokens(a) + ids_of(eng, "<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n")
        back = loop.run(collect(eng, GenerationRequest("a2", nxt, greedy(6), session_key="a")))
        cold = loop.run(collect(eng, GenerationRequest("cold", nxt, greedy(6), cache_salt="cold")))
        extra = eng.stats().extra
    finally:
        loop.run(eng.shutdown())
    assert back[-1].cached_tokens >= len(first) + len(tokens(a)) - 1
    assert extra["tier2_restored_tokens"] == back[-1].cached_tokens and extra["tier2_bytes_read"] > 0
    assert cold[-1].cached_tokens == 0 and tokens(back) == tokens(cold)


@pytest.mark.slow  # ~20 s of one thread; the main suite covers the logic on a fake runtime
def test_requests_that_outgrow_a_full_pool_take_turns_without_an_error(loop, embedded_model_dir):
    """A pool of one window (512 cells), two ~185-token prompts with 90-token replies at once:
    their replies fill the pool, the newer one gives way and resumes after the older one (its
    prompt and reply so far computed again), and both end as asked, with no error. That the tokens
    equal a lone run's is checked on the fake runtime (test_engine_fake.py): on llama.cpp a 2-row
    decode and a recomputed prefill round differently from a lone 1-row decode, and greedy
    decoding of this small model amplifies the last bit (measured: the older request, never
    preempted, differed from its lone run too)."""
    from server.engines.llamacpp.engine import LlamaCppEngine

    settings = load_settings(
        None, engine="llamacpp", model="embedded", max_model_len=512, threads=1, prefix_cache={"memory_mb": 0}
    )
    eng = LlamaCppEngine(settings.engine_settings(), load_model_facts(settings, "llamacpp"))
    loop.run(eng.start())
    ask = "Count from 1 to 300, separated by commas.<|im_end|>\n<|im_start|>assistant\n"
    prompts = [ids_of(eng, f"<|im_start|>user\n{word * 80}{ask}") for word in ("Please. ", "Kindly. ")]
    # no end of reply before 90 tokens however this ggml build rounds (an early end leaves the pool room)
    no_end = SamplingParams(
        max_tokens=90, temperature=0.0, logit_bias=tuple((t, -100.0) for t in eng.eos_token_ids)
    )
    try:
        alone = [  # each cold (its own cache namespace), as in the run together
            tokens(loop.run(collect(eng, GenerationRequest(f"a{i}", p, no_end, cache_salt=f"a{i}"))))
            for i, p in enumerate(prompts)
        ]

        async def together():
            reqs = [GenerationRequest(f"t{i}", p, no_end, cache_salt=f"t{i}") for i, p in enumerate(prompts)]
            return await asyncio.gather(*(collect(eng, r) for r in reqs))

        both = loop.run(together())
        extra = eng.stats().extra
    finally:
        loop.run(eng.shutdown())
    assert [len(t) for t in alone] == [90, 90]  # no early end: together they outgrow the pool
    assert sum(map(len, prompts)) + 2 * 90 > eng.rt.n_ctx
    assert [c[-1].finish_reason for c in both] == ["length", "length"], [c[-1].error for c in both]
    assert extra["preemptions"] >= 1
    assert [len(tokens(c)) for c in both] == [90, 90]


def test_weight_repacking_follows_the_environment(monkeypatch):
    """AGENTSERVE_LLAMACPP_REPACK=0 loads the weights in the file's layout (no second copy)."""
    from server.engines.llamacpp.runtime import LlamaRuntime

    for value, repack in (("0", False), ("1", True)):
        monkeypatch.setenv("AGENTSERVE_LLAMACPP_REPACK", value)
        rt = LlamaRuntime(embedded_gguf(), 1)
        try:
            assert rt.model_params.use_extra_bufts is repack
        finally:
            rt.close()
