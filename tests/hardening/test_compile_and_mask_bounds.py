"""Grammar compiles run under a time limit (a 400 naming limits.grammar_compile_timeout_s, the worker
unaffected), and the mask rows of every tool list share one byte budget (limits.mask_cache_mb)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest

from server.constrain import compile_cache
from server.constrain.compile_cache import CompileCache, set_compile_timeout
from server.constrain.errors import ConstraintError
from server.constrain.row_cache import ROWS, RowCache
from server.constrain.trie import NameTrie


@pytest.fixture
def short_timeout():
    before = compile_cache.compile_timeout_s()
    set_compile_timeout(0.3)
    yield
    set_compile_timeout(before)


def test_a_slow_compile_is_a_400_and_finishes_into_the_cache(short_timeout):
    cache = CompileCache(8)
    release = threading.Event()
    calls = []

    def slow() -> str:
        calls.append(1)
        release.wait(5)
        return "compiled"

    t0 = time.monotonic()
    with pytest.raises(ConstraintError, match="limits.grammar_compile_timeout_s") as err:
        cache.get_or_make("k", slow, "the arguments grammar of tool 'f'")
    assert time.monotonic() - t0 < 2 and err.value.param == "tools" and "tool 'f'" in err.value.message
    with pytest.raises(ConstraintError):  # the same key waits on the compile under way, never a second one
        cache.get_or_make("k", slow)
    release.set()
    for _ in range(100):
        if len(cache):
            break
        time.sleep(0.02)
    assert cache.get_or_make("k", slow) == "compiled" and len(calls) == 1


def test_a_compile_error_reaches_every_waiter_and_is_not_cached(short_timeout):
    cache = CompileCache(8)

    def bad() -> str:
        raise ConstraintError("bad schema", param="tools")

    for _ in range(2):
        with pytest.raises(ConstraintError, match="bad schema"):
            cache.get_or_make("k", bad)
    assert len(cache) == 0


def test_the_lru_keeps_its_entry_bound():
    cache = CompileCache(2)
    for k in "abc":
        cache.get_or_make(k, lambda k=k: k.upper())
    assert len(cache) == 2 and cache.get_or_make("c", lambda: "new") == "C"


def test_mask_rows_share_one_byte_budget():
    rows = RowCache(max_bytes=10_000)
    for i in range(50):
        rows.get_or_make(("owner", i), lambda: np.zeros(500, dtype=np.int32))  # 2,000 bytes each
    assert rows.bytes <= 10_000 and len(rows) == 5
    assert rows.get_or_make(("owner", 49), lambda: np.ones(1, dtype=np.int32)).nbytes == 2_000  # newest kept
    rows.set_budget(4_000)
    assert rows.bytes <= 4_000


def test_trie_masks_stay_right_when_their_rows_are_evicted(tokenizer):
    from server.constrain.vocab import TokenVocab

    vocab = TokenVocab.from_tokenizer(tokenizer)
    names = tuple(f"tool_{i}_{w}" for i in range(6) for w in ("read", "write"))
    trie = NameTrie(vocab, names, b'"', b'"', b"")
    before = ROWS.max_bytes
    try:
        subsets = [(1 << i) | (1 << (i + 3)) for i in range(8)]
        fresh = {s: trie.vocab.pack(trie.allowed_ids(0, s)) for s in subsets}
        ROWS.set_budget(3 * next(iter(fresh.values())).nbytes)  # room for three rows
        for _ in range(2):
            for s in subsets:
                assert np.array_equal(trie.mask_row(0, s), fresh[s])
        assert ROWS.bytes <= ROWS.max_bytes
    finally:
        ROWS.set_budget(before)


@pytest.mark.e2e
def test_a_tool_schema_whose_compile_hangs_is_a_400_over_http(hf_engine, monkeypatch):
    from server.app import build_app
    from server.config import load_settings
    from server.constrain.arguments.xgrammar import XGrammarBackend
    from tests.conftest import running_server
    from tests.hardening.helpers import assert_still_answers, chat, clean_latency

    real = XGrammarBackend._compile

    def slow(self, tool, *a, **k):
        if tool == "slow_tool":
            time.sleep(3)
        return real(self, tool, *a, **k)

    monkeypatch.setattr(XGrammarBackend, "_compile", slow)
    settings = load_settings(device="cpu", limits={"grammar_compile_timeout_s": 0.5})
    try:
        with running_server(build_app(settings, engine=hf_engine)) as url:
            baseline = clean_latency(url)
            # a schema no other test compiles (compiled grammars are cached by schema, whatever the tool)
            params = {"type": "object", "properties": {"only_in_the_timeout_test": {"type": "string"}}}
            tool = {"type": "function", "function": {"name": "slow_tool", "parameters": params}}
            r = chat(url, tools=[tool], tool_choice="required")
            assert r.status_code == 400, r.text
            assert "limits.grammar_compile_timeout_s" in r.json()["error"]["message"]
            assert_still_answers(url, baseline)
    finally:
        set_compile_timeout(30.0)


# issue 37 item 2: compiled grammars bounded in bytes, pattern schemas bounded before compile,
# a compile past the time limit frees what can be freed


def _pattern_schema(patterns: list[str]) -> dict:
    props = {f"p{i}": {"type": "string", "pattern": p} for i, p in enumerate(patterns)}
    return {"type": "object", "properties": props, "required": sorted(props)}


def test_a_pattern_schema_over_the_cost_limit_is_a_400_before_any_compile():
    from server.chat.limits import check_schema_bounds
    from server.config import LimitsSettings
    from server.errors import InvalidRequest

    limits = LimitsSettings()
    # what agents send: names, dates, ids (a few dozen positions each)
    fine = ["^[a-zA-Z0-9_-]{1,64}$", r"^\d{4}-\d{2}-\d{2}$", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}$"]
    check_schema_bounds(_pattern_schema(fine), limits, "tools[0].function.parameters")
    # 132 bytes of schema that xgrammar expands to 1,104 positions (10 s here): 4 of them, ~530 bytes
    heavy = [rf"[a-z0-9]{{1,64}}(\.[a-z{i}]{{1,64}}){{0,16}}" for i in range(4)]
    t0 = time.perf_counter()
    with pytest.raises(InvalidRequest, match="limits.max_schema_pattern_cost") as err:
        check_schema_bounds(_pattern_schema(heavy), limits, "tools[0].function.parameters")
    assert time.perf_counter() - t0 < 0.05 and "4416" in err.value.message
    nested = {"type": "string", "pattern": "((a{10}){10}){30}"}  # nested repetitions multiply: 3,000
    with pytest.raises(InvalidRequest, match="limits.max_schema_pattern_cost"):
        check_schema_bounds({"patternProperties": {"x": nested}}, limits, "response_format")


def test_compiled_grammars_are_charged_their_bytes_in_the_shared_budget():
    store = RowCache(max_bytes=10_000)
    cache = CompileCache(512, size=len, store=store)
    for i in range(50):
        cache.get_or_make(i, lambda i=i: "x" * 2_000)  # 2,000 bytes each: an entry bound of 512 kept all
    assert store.bytes <= 10_000 and len(cache) == 5
    assert cache.get_or_make("huge", lambda: "y" * 20_000) == "y" * 20_000  # served, not kept
    assert store.bytes <= 10_000 and len(cache) == 5
    # mask rows and grammars share the budget: rows push the least recently used grammars out
    for i in range(3):
        store.get_or_make(("rows", i), lambda: np.zeros(500, dtype=np.int32))
    assert store.bytes <= 10_000 and len(cache) == 2


@pytest.fixture(scope="module")
def vocab(tokenizer):
    from server.constrain.vocab import TokenVocab

    return TokenVocab.from_tokenizer(tokenizer, len(tokenizer))


def test_the_xgrammar_compiler_cache_is_bounded_and_its_errors_are_400s(vocab):
    from server.constrain.arguments.seam import CallFrame
    from server.constrain.arguments.xgrammar import XGRAMMAR_CACHE_BYTES, XGrammarBackend

    backend = XGrammarBackend(vocab)
    assert 0 < backend.compiler.cache_limit_bytes == XGRAMMAR_CACHE_BYTES  # -1 (unlimited) before
    compiled = backend.compile("ok", {"type": "object", "properties": {"a": {"type": "string"}}}, CallFrame())
    assert compiled.memory_size_bytes > 0
    # xgrammar 0.2.8 refuses this pattern only in compile_grammar, with a RuntimeError (a 500 before)
    bad = {"type": "object", "properties": {"s": {"type": "string", "pattern": "[a-z]{0,200}"}}}
    with pytest.raises(ConstraintError, match="tool 'f'") as err:
        backend.compile("f", {**bad, "required": ["s"]}, CallFrame())
    assert err.value.param == "tools"


def test_a_compile_that_could_not_start_in_time_never_runs_and_an_overdue_one_fails_fast(
    short_timeout, monkeypatch
):
    # its own two pool threads: an earlier test's compile still running must not take one of them
    monkeypatch.setattr(compile_cache, "POOL", compile_cache.new_pool())
    cache = CompileCache(8)
    release = threading.Event()
    ran: list[str] = []

    def slow(key: str):
        def make() -> str:
            ran.append(key)
            release.wait(10)
            return key

        return make

    busy = [threading.Thread(target=lambda k=k: _swallow(cache, k, slow(k))) for k in ("a", "b")]
    for t in busy:
        t.start()
    for _ in range(2000):  # both pool threads busy (seconds on a loaded box: wait, never guess)
        if len(ran) == 2:
            break
        time.sleep(0.01)
    assert sorted(ran) == ["a", "b"]
    with pytest.raises(ConstraintError, match="limits.grammar_compile_timeout_s"):
        cache.get_or_make("queued", slow("queued"))  # waited in the queue past the limit: cancelled
    for t in busy:
        t.join(5)  # their requests got the 400; their compiles still run
    t0 = time.monotonic()
    with pytest.raises(ConstraintError, match="limits.grammar_compile_timeout_s"):
        cache.get_or_make("a", slow("a"))  # still running past the limit: refused at once
    assert time.monotonic() - t0 < 0.1
    release.set()
    for _ in range(100):
        if len(cache) == 2:
            break
        time.sleep(0.02)
    assert "queued" not in ran and sorted(ran) == ["a", "b"]
    assert cache.get_or_make("a", slow("again")) == "a"  # the overdue compile finished into the cache


def _swallow(cache: CompileCache, key: str, make) -> None:
    try:
        cache.get_or_make(key, make)
    except ConstraintError:
        pass


def test_a_compile_done_before_its_callback_is_added_does_not_deadlock(monkeypatch):
    """A fast compile (or one xgrammar answers from its own cache) can finish before get_or_make adds
    its done callback under the lock; the callback then runs at once in the same thread and takes the
    lock again. With a plain Lock that hung the request for good (seen: a 300 s test timeout)."""
    done: Future[str] = Future()
    done.set_result("compiled")
    monkeypatch.setattr(compile_cache.POOL, "submit", lambda make: done)
    cache = CompileCache(8)
    got: list[str] = []
    worker = threading.Thread(
        target=lambda: got.append(cache.get_or_make("k", lambda: "compiled")), daemon=True
    )
    worker.start()
    worker.join(5)
    assert got == ["compiled"] and len(cache) == 1
