"""The llamacpp engine's loop on a fake runtime (no llama_cpp): batching, the slot cache, eviction.

The fake's next token is a function of the sequence's WHOLE history as its KV holds it, so a
prefix copied wrongly, a position off by one or a row read from another sequence changes
what the engine decodes: each test compares against a cold run or a run alone.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from server.config import load_settings
from server.engines.base import GenerationRequest, SamplingParams
from server.engines.llamacpp.batch import KVFull, Row
from server.engines.llamacpp.engine import LlamaCppEngine
from server.families.model_facts import decide


class FakeRuntime:
    n_vocab = 49152
    n_ctx_train = 4096

    def __init__(self) -> None:
        self.kv: dict[int, list[int]] = {}
        self.n_ctx = 0
        self._rows: list[list[int]] = []
        self.decodes = 0
        self.batch_sizes: list[int] = []
        self.saves = 0
        self.refuse_loads = False  # a pool with no room for any saved state

    def kv_bytes_per_token(self) -> int:
        return 1000

    def open(self, n_ctx: int, n_seq: int, n_batch: int) -> None:
        self.n_ctx = n_ctx
        self.kv = {i: [] for i in range(n_seq)}

    def seq_copy(self, src: int, dst: int, n: int) -> None:
        assert not self.kv[dst], "a copy goes into an emptied sequence"
        self.kv[dst] = self.kv[src][:n]

    def seq_trim(self, seq: int, n: int) -> None:
        self.kv[seq] = self.kv[seq][:n]

    def seq_save(self, seq: int) -> torch.Tensor:
        self.saves += 1
        return torch.tensor(self.kv[seq], dtype=torch.int64)

    def seq_load(self, seq: int, state: torch.Tensor) -> bool:
        self.kv[seq] = []
        if self.refuse_loads or sum(map(len, self.kv.values())) + state.numel() > self.n_ctx:
            return False
        self.kv[seq] = [int(t) for t in state]
        return True

    def decode(self, rows: list[Row]) -> list[int]:
        if sum(map(len, self.kv.values())) + len(rows) > self.n_ctx:
            raise KVFull("full")
        self.decodes += 1
        self.batch_sizes.append(len(rows))
        self._rows = []
        wanted = []
        for i, r in enumerate(rows):
            assert r.pos == len(self.kv[r.seq]), "positions are contiguous in each sequence"
            self.kv[r.seq].append(r.token)
            if r.logits:
                wanted.append(i)
            self._rows.append(list(self.kv[r.seq]))
        return wanted

    def logits(self, i: int) -> torch.Tensor:
        history = self._rows[i]
        nxt = 100 + sum((j + 1) * t for j, t in enumerate(history)) % 1000
        out = torch.zeros(self.n_vocab)
        out[nxt] = 10.0
        return out

    def close(self) -> None:
        pass


def make_engine(tokenizer, **settings):
    """The pool alone unless a test asks for tier 2 (the engine's default turns it on)."""
    settings.setdefault("prefix_cache", {"memory_mb": 0, "policy": "lru"})
    settings["prefix_cache"].setdefault("tier2", {"memory_mb": 0})
    s = load_settings(None, engine="llamacpp", max_model_len=256, **settings)
    return LlamaCppEngine(s.engine_settings(), decide(s, tokenizer, None), runtime=FakeRuntime())


async def collect(engine, request):
    return [c async for c in engine.generate(request)]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0)


def tokens(chunks) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def engine(tokenizer):
    eng = make_engine(tokenizer)
    yield eng
    run(eng.shutdown())


def test_requests_batched_together_decode_what_each_decodes_alone(tokenizer):
    prompts = [[500 + i] * (10 + 7 * i) for i in range(4)]

    async def alone():
        eng = make_engine(tokenizer)
        out = [
            tokens(await collect(eng, GenerationRequest(f"a{i}", p, greedy(8))))
            for i, p in enumerate(prompts)
        ]
        await eng.shutdown()
        return out

    async def together():
        eng = make_engine(tokenizer)
        out = await asyncio.gather(
            *(collect(eng, GenerationRequest(f"b{i}", p, greedy(8))) for i, p in enumerate(prompts))
        )
        sizes = eng.rt.batch_sizes
        await eng.shutdown()
        return [tokens(c) for c in out], sizes

    solo = run(alone())
    both, sizes = run(together())
    assert both == solo and all(len(t) == 8 for t in solo)
    assert max(sizes) > 1 + max(map(len, prompts))  # prompts and decode rows shared batches


def test_the_next_turn_and_another_session_reuse_the_kv_and_decode_as_cold(engine):
    system = list(range(300, 360))
    first = system + [1000, 1001]

    async def scenario():
        a = await collect(engine, GenerationRequest("t1", first, greedy(5), session_key="s1"))
        nxt = first + tokens(a) + [1002, 1003]
        b = await collect(engine, GenerationRequest("t2", nxt, greedy(5), session_key="s1"))
        other = system + [2000]
        c = await collect(engine, GenerationRequest("o", other, greedy(5), session_key="s2"))
        cold_b = await collect(engine, GenerationRequest("cb", nxt, greedy(5), cache_salt="x"))
        cold_c = await collect(engine, GenerationRequest("cc", other, greedy(5), cache_salt="y"))
        return a, b, c, cold_b, cold_c, nxt

    a, b, c, cold_b, cold_c, nxt = run(scenario())
    assert a[-1].cached_tokens == 0
    assert b[-1].cached_tokens == len(first) + 4  # the prompt and the reply's tokens that went in the KV
    assert c[-1].cached_tokens == len(system)
    assert cold_b[-1].cached_tokens == 0 and cold_c[-1].cached_tokens == 0
    assert tokens(b) == tokens(cold_b) and tokens(c) == tokens(cold_c)
    stats = engine.stats()
    assert stats.prefix_hits_tokens == b[-1].cached_tokens + c[-1].cached_tokens
    assert stats.running == 0 and stats.extra["idle_cached_tokens"] > 0


def test_the_next_turn_with_the_reply_in_other_tokens_reuses_the_slot_and_leaves_no_dead_branch(engine):
    """The client renders the model's reply its own way: the next turn holds the whole prompt, not the
    reply's tokens. Its slot is the old one, trimmed: the pool holds one sequence, not two."""
    first = list(range(300, 360))

    async def scenario():
        a = await collect(engine, GenerationRequest("t1", first, greedy(5), session_key="s1"))
        nxt = first + [7, 7, 7, 1002]  # the reply as the client rendered it
        b = await collect(engine, GenerationRequest("t2", nxt, greedy(5), session_key="s1"))
        return a, b, nxt

    a, b, nxt = run(scenario())
    held = [kv for kv in engine.rt.kv.values() if kv]
    assert b[-1].cached_tokens == len(first)
    assert held == [nxt + tokens(b)[:-1]]  # the reply's last token never went into the KV
    assert engine.stats().extra["idle_cached_tokens"] == len(held[0])


def test_a_full_pool_evicts_idle_sessions_least_recently_used_first(engine):
    async def scenario():
        outs = []
        for i in range(4):  # 4 x ~105 tokens in a pool of 256 cells
            outs.append(
                await collect(
                    engine, GenerationRequest(f"s{i}", [700 + i] * 100, greedy(5), session_key=f"s{i}")
                )
            )
        last = await collect(engine, GenerationRequest("again", [703] * 100 + [5], greedy(3)))
        first = await collect(engine, GenerationRequest("first", [700] * 100 + [5], greedy(3)))
        return outs, last, first

    outs, last, first = run(scenario())
    assert all(o[-1].finish_reason == "length" for o in outs)
    assert last[-1].cached_tokens >= 100  # the most recent session is still there
    assert first[-1].cached_tokens == 0  # the oldest was evicted
    assert sum(map(len, engine.rt.kv.values())) <= engine.rt.n_ctx


def test_cancelling_keeps_the_kv_and_frees_the_slot(engine):
    async def scenario():
        gen = engine.generate(GenerationRequest("c", [900] * 30, greedy(100), session_key="c"))
        got = [await gen.__anext__(), await gen.__anext__()]
        await gen.aclose()
        for _ in range(100):
            if engine.stats().running == 0:
                break
            await asyncio.sleep(0.01)
        again = await collect(engine, GenerationRequest("c2", [900] * 30 + tokens(got), greedy(2)))
        return got, again

    got, again = run(scenario())
    assert len(got) == 2 and engine.stats().running == 0
    assert again[-1].cached_tokens >= 30


def test_the_engine_thread_never_wakes_a_clients_event_loop(tokenizer):
    """Chunks reach the clients through the outbox's thread: the engine thread, which runs
    ``llama_decode``, never waits on an event loop for the GIL (outbox.py). Every token arrives."""
    wakers: list[str] = []

    async def go():
        loop = asyncio.get_running_loop()
        wake = loop.call_soon_threadsafe

        def recording(*args, **kwargs):
            wakers.append(threading.current_thread().name)
            return wake(*args, **kwargs)

        loop.call_soon_threadsafe = recording  # type: ignore[method-assign]
        eng = make_engine(tokenizer)
        out = await asyncio.gather(
            *(collect(eng, GenerationRequest(f"w{i}", [600 + i] * 12, greedy(6))) for i in range(8))
        )
        await eng.shutdown()
        return [tokens(c) for c in out]

    got = run(go())
    assert [len(t) for t in got] == [6] * 8
    assert "llamacpp-outbox" in wakers and "llamacpp-engine" not in wakers


def four_sessions_then_the_first_again(engine):
    """4 sessions of ~105 tokens in a pool of 256 cells (the first two are evicted), then the
    first session's next turn and the same prompt cold (another namespace)."""

    async def scenario():
        outs = []
        for i in range(4):
            prompt = [700 + i] * 100
            outs.append(
                await collect(engine, GenerationRequest(f"s{i}", prompt, greedy(5), session_key=f"s{i}"))
            )
        nxt = [700] * 100 + tokens(outs[0]) + [5, 6]
        back = await collect(engine, GenerationRequest("back", nxt, greedy(6), session_key="s0"))
        cold = await collect(engine, GenerationRequest("cold", nxt, greedy(6), cache_salt="cold"))
        return back, cold

    return run(scenario())


def test_an_evicted_session_comes_back_from_tier_2_and_decodes_as_cold(tokenizer):
    eng = make_engine(tokenizer, prefix_cache={"memory_mb": 0, "policy": "lru", "tier2": {"memory_mb": 1}})
    try:
        back, cold = four_sessions_then_the_first_again(eng)
        stats = eng.stats().extra
        tiers = eng.cache_tiers
    finally:
        run(eng.shutdown())
    assert back[-1].cached_tokens == 104  # its prompt and the reply tokens that went in the KV, restored
    assert cold[-1].cached_tokens == 0
    assert tokens(back) == tokens(cold)  # the restored KV is the session's own, at its positions
    assert eng.rt.saves >= 2 and stats["tier2_restored_tokens"] == 104
    assert stats["tier2_saved_tokens"] >= 2 * 104 and stats["tier2_bytes_read"] > 0
    assert tiers == ("llama.cpp KV cells", "tier 2 (host RAM)")


def test_tier_2_is_on_by_default_in_host_ram_and_zero_turns_it_off(tokenizer):
    default = make_engine(tokenizer, prefix_cache={"policy": "lru", "tier2": {}})
    off = make_engine(tokenizer, prefix_cache={"policy": "lru", "tier2": {"memory_mb": 0}})
    assert default.saved.enabled and default.cache_tiers == ("llama.cpp KV cells", "tier 2 (host RAM)")
    assert default.saved.store is not None and 0 < default.saved.store.capacity_bytes <= 8192 * 2**20
    assert not off.saved.enabled and off.cache_tiers == ("llama.cpp KV cells",)
    for eng in (default, off):
        run(eng.shutdown())


def test_with_tier_2_idle_sessions_leave_the_pool_when_a_request_is_admitted_and_come_back(tokenizer):
    """Idle cells in the pool cost every later batch (it attends over the used range): with tier 2
    on, another session's admission moves them to host RAM; a session's own next turn, arriving
    first, takes its slot where it is (nothing saved)."""
    eng = make_engine(tokenizer, prefix_cache={"memory_mb": 4, "policy": "lru", "tier2": {"memory_mb": 1}})
    a_prompt, b_prompt = [701] * 80, [702] * 60

    async def scenario():
        a = await collect(eng, GenerationRequest("a", a_prompt, greedy(5), session_key="a"))
        a2_prompt = a_prompt + tokens(a) + [9]
        a2 = await collect(eng, GenerationRequest("a2", a2_prompt, greedy(5), session_key="a"))
        saves_before_b = eng.rt.saves
        b = await collect(eng, GenerationRequest("b", b_prompt, greedy(5), session_key="b"))
        held_after_b = [kv for kv in eng.rt.kv.values() if kv]
        a3_prompt = a2_prompt + tokens(a2) + [9]
        a3 = await collect(eng, GenerationRequest("a3", a3_prompt, greedy(5), session_key="a"))
        held_after_a3 = [kv for kv in eng.rt.kv.values() if kv]
        cold = await collect(eng, GenerationRequest("cold", a3_prompt, greedy(5), cache_salt="cold"))
        return a2, saves_before_b, b, held_after_b, a3, held_after_a3, cold, a2_prompt, a3_prompt

    try:
        a2, saves_before_b, b, held_after_b, a3, held_after_a3, cold, a2_prompt, a3_prompt = run(scenario())
        extra = eng.stats().extra
    finally:
        run(eng.shutdown())
    assert saves_before_b == 0 and a2[-1].cached_tokens == len(a_prompt) + 4  # its own slot, in place
    assert held_after_b == [b_prompt + tokens(b)[:-1]]  # a's slot went to tier 2 when b was admitted
    assert a3[-1].cached_tokens == len(a2_prompt) + 4  # restored from tier 2, prompt and reply
    assert tokens(a3) == tokens(cold) and extra["tier2_restored_tokens"] == len(a2_prompt) + 4
    assert held_after_a3 == [a3_prompt + tokens(a3)[:-1]]  # and b's when a3 was


def test_a_prompt_that_shares_part_of_a_saved_session_leaves_the_session_saved(tokenizer):
    """b shares a's system prompt: its admission loads a's state and keeps the shared part, and a's
    state stays in tier 2, so a's next turn finds its whole history (it was taken and lost)."""
    eng = make_engine(tokenizer, prefix_cache={"memory_mb": 4, "policy": "lru", "tier2": {"memory_mb": 1}})
    system = list(range(300, 340))
    a_prompt, b_prompt = system + [701] * 50, system + [702] * 30

    async def scenario():
        a = await collect(eng, GenerationRequest("a", a_prompt, greedy(5), session_key="a"))
        await collect(eng, GenerationRequest("x", [900] * 20, greedy(2), session_key="x"))  # a to tier 2
        b = await collect(eng, GenerationRequest("b", b_prompt, greedy(5), session_key="b"))
        a2_prompt = a_prompt + tokens(a) + [9]
        a2 = await collect(eng, GenerationRequest("a2", a2_prompt, greedy(5), session_key="a"))
        cold = await collect(eng, GenerationRequest("cold", a2_prompt, greedy(5), cache_salt="cold"))
        return b, a2, cold, a2_prompt

    try:
        b, a2, cold, a2_prompt = run(scenario())
        extra = eng.stats().extra
    finally:
        run(eng.shutdown())
    assert b[-1].cached_tokens == len(system)
    assert a2[-1].cached_tokens == len(a_prompt) + 4 and tokens(a2) == tokens(cold)
    # a went when x came, x when b did, b when a2 did, a2 when cold did; a's put-back is no save
    saved = (len(a_prompt) + 4) + 21 + (len(b_prompt) + 4) + (len(a2_prompt) + 4)
    assert extra["tier2_saved_tokens"] == saved


def test_without_tier_2_the_evicted_session_is_recomputed(tokenizer):
    eng = make_engine(tokenizer)
    try:
        back, cold = four_sessions_then_the_first_again(eng)
    finally:
        run(eng.shutdown())
    assert back[-1].cached_tokens == 0 and tokens(back) == tokens(cold)
    assert eng.rt.saves == 0 and "tier2_restored_tokens" not in eng.stats().extra


def test_restore_never_turns_tier_2_off(tokenizer):
    eng = make_engine(
        tokenizer,
        prefix_cache={"memory_mb": 0, "policy": "lru", "tier2": {"memory_mb": 1, "restore": "never"}},
    )
    try:
        back, _ = four_sessions_then_the_first_again(eng)
    finally:
        run(eng.shutdown())
    assert back[-1].cached_tokens == 0 and eng.rt.saves == 0


def test_a_state_that_cannot_be_loaded_is_recomputed_and_kept(tokenizer):
    eng = make_engine(tokenizer, prefix_cache={"memory_mb": 0, "policy": "lru", "tier2": {"memory_mb": 1}})
    eng.rt.refuse_loads = True
    try:
        back, cold = four_sessions_then_the_first_again(eng)
        kept = len(eng.saved)
    finally:
        run(eng.shutdown())
    assert back[-1].cached_tokens == 0 and tokens(back) == tokens(cold)  # never a wrong KV
    assert kept >= 1 and eng.stats().extra["tier2_restored_tokens"] == 0


def three_sessions(tokenizer, policy: str, between) -> set[str]:
    """Sessions a and b (100 tokens each), ``between(engine)`` (returns b's session key), then c:
    315 tokens in 256 cells, so c's prompt evicts a or b. Returns the sessions still in the pool."""
    eng = make_engine(tokenizer, prefix_cache={"memory_mb": 0, "policy": policy})
    now = [100.0]
    eng.retention.clock = lambda: now[0]
    names = {701: "a", 702: "b", 703: "c"}

    async def scenario():
        await collect(eng, GenerationRequest("a", [701] * 100, greedy(5), session_key="a"))
        eng.reply_finished("a", ["shell_exec"])  # the chat service: a's reply was a tool call
        now[0] += 1.0
        await collect(eng, GenerationRequest("b", [702] * 100, greedy(5), session_key=between(eng)))
        now[0] += 1.0
        await collect(eng, GenerationRequest("c", [703] * 100, greedy(5), session_key="c"))
        await eng.shutdown()

    run(scenario())
    assert sum(map(len, eng.rt.kv.values())) <= eng.rt.n_ctx
    return {names[kv[0]] for kv in eng.rt.kv.values() if kv}


def test_the_session_policy_gives_up_a_request_no_session_needs_before_a_paused_session(tokenizer):
    assert three_sessions(tokenizer, "session", lambda eng: "") == {"a", "c"}  # a waits on its tool
    assert three_sessions(tokenizer, "lru", lambda eng: "") == {"b", "c"}  # least recently used: a went


def test_a_session_whose_next_request_arrived_is_kept(tokenizer):
    def b_then_a_arrives(eng) -> str:
        eng.reply_finished("a", [])  # a's reply was text: a person reads it
        eng.request_arrived("a")  # ... and a's next request arrived (it waits for the engine)
        return "b"

    def b_only(eng) -> str:
        eng.reply_finished("a", [])
        return "b"

    assert three_sessions(tokenizer, "session", b_then_a_arrives) == {"a", "c"}
    assert three_sessions(tokenizer, "session", b_only) == {"b", "c"}  # without the event a went
    assert three_sessions(tokenizer, "lru", b_then_a_arrives) == {"b", "c"}


def alone_then_together(tokenizer, prompts: list[list[int]], n: int, together: bool = False, **settings):
    """``prompts`` (``n`` greedy tokens each) on a new engine, one after another or all at once:
    each request's chunks, and the engine's stats at the end."""

    async def go():
        eng = make_engine(tokenizer, **settings)
        reqs = [GenerationRequest(f"r{i}", p, greedy(n), session_key=f"r{i}") for i, p in enumerate(prompts)]
        if together:
            out = await asyncio.gather(*(collect(eng, r) for r in reqs))
        else:
            out = [await collect(eng, r) for r in reqs]
        stats = eng.stats()
        await eng.shutdown()
        return out, stats

    return run(go())


def test_prompts_that_do_not_fit_beside_the_running_wait_for_them_and_nothing_fails(tokenizer):
    """Three 150-token prompts at once in a pool of 256 cells: one runs, the others give way (no
    'KV cache is full' error) and each decodes what it decodes alone."""
    prompts = [[800 + i] * 150 for i in range(3)]

    alone, _ = alone_then_together(tokenizer, prompts, 20)
    both, stats = alone_then_together(tokenizer, prompts, 20, together=True)
    assert [c[-1].finish_reason for c in both] == ["length"] * 3, [c[-1].error for c in both]
    assert [tokens(c) for c in both] == [tokens(c) for c in alone]
    assert all(c[-1].cached_tokens == 0 for c in both)  # nothing was cached when they arrived
    assert stats.prefix_queries_tokens == 3 * 150  # each prompt counted once, though admitted again


@pytest.mark.parametrize("tier2", [False, True])
def test_running_requests_that_outgrow_the_pool_take_turns_and_decode_what_they_decode_alone(
    tokenizer, tier2
):
    """Two 100-token prompts, 60 tokens each, in a pool of 256 cells: both start, and their replies
    fill the pool. The newer one gives way (its KV dropped, or saved to tier 2 and loaded back),
    the older one finishes, then the newer one computes what it had and goes on. Before, every
    running request of the batch that found no cell ended with an error."""
    prompts = [[900 + i] * 100 for i in range(2)]
    cache = {"memory_mb": 0, "policy": "lru", **({"tier2": {"memory_mb": 1}} if tier2 else {})}

    alone, quiet = alone_then_together(tokenizer, prompts, 60, prefix_cache=cache)
    both, stats = alone_then_together(tokenizer, prompts, 60, together=True, prefix_cache=cache)
    assert [c[-1].finish_reason for c in both] == ["length"] * 2, [c[-1].error for c in both]
    assert [len(tokens(c)) for c in both] == [60, 60]
    assert [tokens(c) for c in both] == [tokens(c) for c in alone]  # the same tokens, as if never stopped
    assert quiet.extra["preemptions"] == 0 and stats.extra["preemptions"] >= 1
    assert stats.prefix_queries_tokens == 2 * 100  # each prompt counted once, though admitted again
    if tier2:
        assert stats.extra["tier2_restored_tokens"] >= 100  # the preempted request's KV came back


def test_the_engine_releases_freed_heap_once_it_goes_idle_not_while_it_works(tokenizer, monkeypatch):
    calls: list[bool] = []
    eng = make_engine(tokenizer)
    monkeypatch.setattr(
        "server.engines.llamacpp.engine.release_free_heap", lambda: calls.append(eng.scheduler.busy)
    )

    async def idle(n: int) -> None:
        for _ in range(500):  # the engine thread notices it is idle within a loop turn
            if len(calls) >= n:
                return
            await asyncio.sleep(0.01)

    async def scenario():
        await collect(eng, GenerationRequest("a", [701] * 40, greedy(8)))
        await idle(1)
        await collect(eng, GenerationRequest("b", [702] * 40, greedy(8)))
        await idle(2)
        await asyncio.sleep(0.1)  # and no more while nothing runs

    try:
        run(scenario())
    finally:
        run(eng.shutdown())
    assert calls == [False, False]  # once after each request, never with one running


def test_a_running_engine_keeps_torch_to_one_thread_and_gives_the_setting_back(tokenizer):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    eng = make_engine(tokenizer)
    try:
        run(collect(eng, GenerationRequest("a", [701] * 10, greedy(2))))
        during = torch.get_num_threads()
    finally:
        run(eng.shutdown())
        after = torch.get_num_threads()
        torch.set_num_threads(before)
    assert during == 1 and after == 2  # torch's team no longer competes with llama.cpp's for cores
