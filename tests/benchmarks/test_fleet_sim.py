"""The fleet simulation's worker cache: LRU cut from the tail, and a tier 2 that keeps what tier 1 evicts."""

from __future__ import annotations

from benchmarks.fleet.fleet_sim import Worker, make_workload, registered, simulate


def test_tier1_eviction_cuts_the_lru_entry_from_its_tail_and_tier2_keeps_it():
    for capacity2 in (0, 10_000):
        w = Worker("w")
        w.store(agent=0, prefix_len=100, session=1, own_tokens=900, capacity=2000, capacity2=capacity2)
        w.store(agent=1, prefix_len=100, session=2, own_tokens=1400, capacity=2000, capacity2=capacity2)
        # 2,500 tokens in a 2,000-token tier 1: session 1 (the LRU entry) loses its last 500 tokens...
        assert w.size == 2000 and w.cache[("s", 1)] == 400
        # ...which only tier 2 still serves, as restored tokens
        cached, restored = w.lookup(agent=0, prefix_len=100, session=1, own=900)
        assert (cached, restored) == ((100 + 900, 500) if capacity2 else (100 + 400, 0))
        # a request restores the entry: all of it in tier 1 again, none in tier 2
        w.store(agent=0, prefix_len=100, session=1, own_tokens=950, capacity=2000, capacity2=capacity2)
        assert w.tier2.get(("s", 1), 0) == 0 and w.cache[("s", 1)] == 950
        assert w.size <= 2000 and w.size2 <= capacity2


def test_tier2_is_bounded_and_lru():
    w = Worker("w")
    for session in range(10):
        w.store(agent=0, prefix_len=10, session=session, own_tokens=100, capacity=210, capacity2=300)
    assert w.size <= 210 and w.size2 == 300
    assert w.lookup(0, 10, 9, 100) == (110, 0)  # the newest session: tier 1
    assert w.lookup(0, 10, 0, 100) == (10, 0)  # the oldest: gone from both tiers
    assert sum(w.tier2.values()) == w.size2


def test_a_tier2_serves_more_of_the_ideal_when_tier1_is_small():
    wl = make_workload(sessions=150, agents=5, rate=5.0, seed=3)
    args = (wl, 4, 20_000, 0, 0, 0.0)
    without = simulate(registered("affinity", 2.0, 4, 0.1), *args)
    with_t2 = simulate(registered("affinity", 2.0, 4, 0.1), *args, capacity2=200_000)
    assert without["lost_evicted"] > 0.05  # the small tier 1 does evict
    assert with_t2["hit_rate_of_ideal"] > without["hit_rate_of_ideal"] + 0.05
    assert with_t2["lost_evicted"] < without["lost_evicted"] / 2
