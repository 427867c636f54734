"""Grammar compiles run under a time limit (a 400 naming limits.grammar_compile_timeout_s, the worker
unaffected), and the mask rows of every tool list share one byte budget (limits.mask_cache_mb)."""

from __future__ import annotations

import threading
import time

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
    from server.constrain.arguments import XGrammarBackend
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
            tool = {"type": "function", "function": {"name": "slow_tool", "parameters": {"type": "object"}}}
            r = chat(url, tools=[tool], tool_choice="required")
            assert r.status_code == 400, r.text
            assert "limits.grammar_compile_timeout_s" in r.json()["error"]["message"]
            assert_still_answers(url, baseline)
    finally:
        set_compile_timeout(30.0)
