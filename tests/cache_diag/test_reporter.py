"""Baselines and bookkeeping: first request vs unavailable, comparison by response id per tenant, rate."""

from __future__ import annotations

from server.cache_diag import CacheReporter, PrefillRate
from server.cache_diag.baselines import BaselineTable, FingerprintStore
from server.metrics import Metrics
from tests.cache_diag.helpers import prompt, tool

TOOLS = [tool("shell_exec"), tool("file_read")]
SYSTEM = {"role": "system", "content": "You are a careful agent. " * 30}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def conv(*users: str) -> list[dict]:
    msgs = [SYSTEM]
    for i, u in enumerate(users):
        if i:
            msgs.append({"role": "assistant", "content": f"done {i}"})
        msgs.append({"role": "user", "content": u * 20})
    return msgs


def test_first_request_then_extension_then_unavailable_after_the_table_forgot(tokenizer):
    clock = Clock()
    rep = CacheReporter(block_size=32, sessions=2, clock=clock)
    p1 = prompt(tokenizer, conv("task "), TOOLS)
    r = rep.report(session="s1", tenant="", response_id="r1", prompt=p1, cached_tokens=0)
    assert r.diagnosis.type == "first_request" and r.compared_with is None
    assert r.diagnosis.missed_tokens == p1.fp.n_tokens
    clock.t += 7
    p2 = prompt(tokenizer, conv("task ", "more "), TOOLS)
    full = (p1.fp.core_tokens // 32) * 32
    r = rep.report(session="s1", tenant="", response_id="r2", prompt=p2, cached_tokens=full)
    assert r.diagnosis.type is None and r.compared_with == "session"
    r = rep.report(session="s1", tenant="", response_id="r3", prompt=p2, cached_tokens=0)
    assert r.diagnosis.type == "evicted" and r.diagnosis.detail["idle_seconds"] == 0.0
    for other in ("s2", "s3"):  # the table holds 2 sessions: s1 is dropped
        rep.report(session=other, tenant="", response_id=other, prompt=p1, cached_tokens=0)
    r = rep.report(session="s1", tenant="", response_id="r4", prompt=p2, cached_tokens=0)
    assert r.diagnosis.type == "unavailable" and r.diagnosis.missed_tokens is None
    r = rep.report(session="never-seen", tenant="", response_id="r5", prompt=p2, cached_tokens=0)
    assert r.diagnosis.type == "first_request"


def test_comparison_by_response_id_is_per_tenant_and_bounded_in_time(tokenizer):
    clock = Clock()
    rep = CacheReporter(block_size=32, ttl_s=600, clock=clock)
    p1 = prompt(tokenizer, conv("task "), TOOLS)
    rep.report(session="a-1", tenant="A", response_id="chatcmpl-1", prompt=p1, cached_tokens=0)
    changed = conv("task ", "more ")
    changed[0] = {"role": "system", "content": "Now: 10:42. " + SYSTEM["content"]}
    p2 = prompt(tokenizer, changed, TOOLS)
    # another session of tenant A names the response: compared with it, not with its own (none)
    r = rep.report(
        session="a-2", tenant="A", response_id="c2", prompt=p2, cached_tokens=0, compare_with="chatcmpl-1"
    )
    assert r.compared_with == "chatcmpl-1" and r.diagnosis.type == "system_changed"
    assert r.diagnosis.detail["character"] == 0 and r.diagnosis.diverged_at_token is not None
    # tenant B cannot compare with tenant A's response: not found, nothing leaks
    r = rep.report(
        session="b-1", tenant="B", response_id="c3", prompt=p2, cached_tokens=0, compare_with="chatcmpl-1"
    )
    assert r.diagnosis.type == "unavailable" and "not known here" in r.diagnosis.reason
    clock.t += 601
    r = rep.report(
        session="a-3", tenant="A", response_id="c4", prompt=p2, cached_tokens=0, compare_with="chatcmpl-1"
    )
    assert r.diagnosis.type == "unavailable"


def test_stores_are_bounded():
    clock = Clock()
    store = FingerprintStore(per_tenant=3, ttl_s=10, clock=clock)
    for i in range(5):
        store.put("A", f"r{i}", i)  # type: ignore[arg-type]
    assert len(store) == 3 and store.get("A", "r0") is None and store.get("A", "r4").value == 4
    table: BaselineTable[str] = BaselineTable(2, ttl_s=10, clock=clock)
    for k in "abc":
        table.put(k, k)
    assert table.get("a") is None and table.get("c") == "c" and len(table) == 2
    assert table.lookup("a") == (None, True) and table.lookup("z") == (None, False)
    clock.t += 11
    assert table.lookup("c") == (None, True)


def test_prefill_rate_is_an_ewma_and_prices_a_miss():
    rate = PrefillRate(alpha=0.5)
    assert rate.seconds(1000) is None
    rate.observe(10, 1.0)  # too short to say anything about the rate
    assert rate.tokens_per_s is None
    rate.observe(1000, 2.0)
    rate.observe(1000, 1.0)
    assert rate.tokens_per_s == 750.0
    assert rate.seconds(1500) == 2.0


def test_metrics_count_misses_and_tokens_by_type():
    m = Metrics()
    m.observe_cache("system_changed", 480)
    m.observe_cache("system_changed", 20)
    m.observe_cache(None, 0)
    text = m.render().decode()
    assert 'agentserve_cache_misses_total{type="system_changed"} 2.0' in text
    assert 'agentserve_cache_missed_tokens_total{type="system_changed"} 500.0' in text
