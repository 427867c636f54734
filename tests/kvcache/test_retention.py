"""Session-aware retention: eviction order for scripted sessions (tool vs person vs done), vs LRU."""

from __future__ import annotations

from server.kvcache.prefix_cache import PrefixCache

BLOCK = 10  # bytes per block payload


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(i: int):
    return (f"kv{i}", BLOCK)


def cache(policy: str, blocks: int = 6, cap_s: float = 600.0):
    clock = Clock()
    c = PrefixCache(2, blocks * BLOCK, policy=policy, clock=clock, session_cap_s=cap_s)
    return c, clock


def turn(c: PrefixCache, session: str, ids: list[int], tools: tuple[str, ...] = ()) -> None:
    """One request of a session: lookup, its blocks cached, its reply ends (tools or text)."""
    c.match(ids, session=session)
    c.insert(ids, "", make, tail=True, session=session)
    c.reply_finished(session, tools)


def held(c: PrefixCache, ids: list[int]) -> int:
    return sum(h in c for h in c.block_hashes(ids))


A, B, C, D, E = ([k] * 4 for k in range(1, 6))  # 2 blocks each; distinct sessions, no shared prefix


def scripted(policy: str) -> tuple[PrefixCache, Clock]:
    c, clock = cache(policy)
    turn(c, "a", A, ("file_read",))  # waiting on a fast tool
    clock.t += 1
    turn(c, "b", B)  # waiting on a person
    clock.t += 1
    turn(c, "c", C)
    c.end_session("c")  # done
    clock.t += 1
    return c, clock


def test_session_policy_evicts_done_then_person_then_tool():
    c, clock = scripted("session")
    turn(c, "d", D, ("shell_exec",))  # 8 blocks > 6: two must go
    assert held(c, C) == 0 and held(c, A) == 2 and held(c, B) == 2 and held(c, D) == 2
    clock.t += 1
    turn(c, "e", E, ("browser_open",))
    # the person (expected back in ~60 s) goes before the tool waiters (~10 s)
    assert held(c, B) == 0 and held(c, A) == 2 and held(c, D) == 2 and held(c, E) == 2
    assert c.used_bytes <= c.capacity_bytes


def test_lru_evicts_the_oldest_session_whatever_it_waits_on():
    c, clock = scripted("lru")
    turn(c, "d", D, ("shell_exec",))
    assert held(c, A) == 0 and held(c, B) == 2 and held(c, C) == 2  # the fast tool's session is lost


def test_a_session_evicts_from_its_tail_and_keeps_its_prefix():
    c, clock = cache("session", blocks=5)
    turn(c, "p", [9] * 8, ())  # 4 blocks, waiting on a person
    clock.t += 1
    turn(c, "t", [7] * 4, ("file_read",))  # 2 blocks: 6 > 5, one of p's goes: its last
    hs = c.block_hashes([9] * 8)
    assert [h in c for h in hs] == [True, True, True, False]


def test_superseded_branch_goes_before_any_waiting_session():
    c, clock = cache("session", blocks=5)
    turn(c, "x", [1, 1, 2, 2, 3, 3], ("file_read",))  # 3 blocks
    clock.t += 1
    turn(c, "y", [5, 5, 6, 6], ())  # person, 2 blocks
    clock.t += 1
    # x comes back with an edited history: its old blocks 1-2 are a superseded branch
    turn(c, "x", [1, 1, 4, 4, 5, 5], ("file_read",))  # +2 blocks: 7 > 5
    assert held(c, [1, 1, 2, 2, 3, 3]) == 1  # block 0 shared, the old branch went first
    assert held(c, [5, 5, 6, 6]) == 2 and held(c, [1, 1, 4, 4, 5, 5]) == 3


def test_no_session_holds_memory_past_its_cap():
    c, clock = cache("session", blocks=4, cap_s=30.0)
    turn(c, "old", [1] * 4, ("shell_exec",))
    clock.t += 31  # past the cap: counts as done
    turn(c, "p", [2] * 4, ())  # a person's session, fresh
    turn(c, "q", [3] * 4, ())  # 6 > 4
    assert held(c, [1] * 4) == 0 and held(c, [2] * 4) == 2 and held(c, [3] * 4) == 2


def test_pauses_are_learned_per_tool():
    c, clock = cache("session")
    turn(c, "a", [1] * 4, ("slow_build",))
    clock.t += 200  # the build took 200 s
    turn(c, "a", [1] * 4 + [8] * 2, ("slow_build",))
    assert c.sessions.pauses.expected(("slow_build",)) > 150
    assert c.sessions.pauses.expected(("file_read",)) == 10.0  # untouched default
    # now a session waiting on slow_build is expected back later than one waiting on a person
    turn(c, "b", [2] * 4, ())
    turn(c, "d", [3] * 4, ())  # 3 + 2 + 2 + 2 > 6 blocks: the slow build's blocks go first
    assert held(c, [1] * 4 + [8] * 2) < 3 and held(c, [2] * 4) == 2


def test_lookup_report_says_what_the_session_waited_on_and_what_was_lost():
    c, clock = cache("session", blocks=4)
    ids = [1] * 6
    turn(c, "s", ids, ("shell_exec",))
    clock.t += 30
    turn(c, "o", [2] * 4, ())
    turn(c, "o2", [3] * 4, ())  # pushes s's blocks out
    m = c.match(ids + [4, 4], session="s")
    r = m.report
    assert r is not None and c.last_lookup("s") == r
    assert r.state == "tool" and r.waiting_on == ("shell_exec",) and round(r.waited_s) == 30
    assert r.kept_tokens == 6 and r.evicted_tokens == 6 - m.cached_tokens > 0
    assert c.counters.sessions_back_evicted == 1


def test_time_to_return_is_the_expected_remaining_pause_given_the_wait_so_far():
    from server.kvcache.retention import SessionRecords

    book = SessionRecords(capacity=16, cap_s=600.0)
    for pause in (1.0, 2.0, 5.0, 25.0, 28.0):  # shell calls: most short, some long builds
        book.pauses.observe(("shell_exec",), pause)
    late, fresh = book.touch("late")[0], book.touch("fresh")[0]
    for s, since in ((late, 76.0), (fresh, 98.0)):
        s.state, s.waiting_on, s.since = "tool", ("shell_exec",), since
    now = 100.0
    # 24 s in, only the long builds are left, and they end within 4 s: it is nearly back;
    # 2 s in, a session may still wait 26 s (|mean - waited| ranked these the other way round)
    assert book.time_to_return(late, now) == 2.5  # mean of 25-24 and 28-24
    assert book.time_to_return(fresh, now) == (3.0 + 23.0 + 26.0) / 3
    assert book.time_to_return(late, now) < book.time_to_return(fresh, now)
    late.since = 60.0  # 40 s in: longer than any pause seen, taken to be gone
    assert book.time_to_return(late, now) == 600.0


def _slow_person_and_a_fast_tool() -> tuple[PrefixCache, Clock]:
    """Session "r" (people take ~200 s to answer it) is running again; "t" paused on a fast tool."""
    c, clock = cache("session", blocks=6)
    turn(c, "r", [1] * 4, ())  # a person's turn...
    clock.t += 200  # ...answered 200 s later: person pauses are learned long
    c.match([1] * 4 + [2] * 2, session="r")  # r's next request: running, its reply not ended
    c.insert([1] * 4 + [2] * 2, "", make, tail=True, session="r")  # 3 blocks
    turn(c, "t", [3] * 4, ("file_read",))  # 2 blocks, waits on a tool of ~10 s
    clock.t += 1
    return c, clock


def test_a_running_session_is_ranked_by_when_its_kv_is_next_needed():
    """While r's reply runs the engine holds its KV; the cache's copy is needed at r's next request,
    after the pause it takes (a person's: ~200 s). t is back in ~10 s: r's blocks go first.
    (Before: a running session was never evicted, and t's blocks went.)"""
    c, clock = _slow_person_and_a_fast_tool()
    turn(c, "n", [4] * 4, ("file_read",))  # 2 more blocks: 7 > 6
    assert held(c, [3] * 4) == 2 and held(c, [4] * 4) == 2
    assert held(c, [1] * 4 + [2] * 2) == 2  # r lost its last block, from its tail
    s = c.sessions.get("r")
    assert s is not None and s.state == "running" and s.last_wait == ("person",)
    assert c.sessions.time_to_return(s, clock.t) > 150


def test_a_request_never_loses_its_own_chain_at_its_insert():
    """r's own insert may not evict r's chain, even though r ranks last (it just came back from a
    200 s pause): t's blocks go instead, and r's whole prompt stays cached."""
    c, clock = _slow_person_and_a_fast_tool()
    ids = [1] * 4 + [2] * 2 + [5] * 4  # r again (a second request in flight), 5 blocks
    c.match(ids, session="r")
    c.insert(ids, "", make, tail=True, session="r")
    assert held(c, ids) == 5 and held(c, [3] * 4) < 2
    assert c.used_bytes <= c.capacity_bytes


def _short_person_pauses_and_a_slow_build() -> PrefixCache:
    """People answer "p" in 8 s, but 1 in 3 leaves for 10 minutes; builds take 50 s. At t=1005
    (both waited 5 s, the oldest block was used 5 s ago) a new session needs 2 blocks' room."""
    c, clock = cache("session", blocks=6)
    for pause in (8.0, 8.0, 8.0, 8.0, 600.0, 600.0):
        c.sessions.pauses.observe(("person",), pause)
    for _ in range(6):
        c.sessions.pauses.observe(("build",), 50.0)
    turn(c, "p", [1] * 4, ())
    turn(c, "b", [2] * 4, ("build",))
    clock.t += 5
    turn(c, "n", [3] * 8, ("build",))  # 4 blocks: 8 > 6
    return c


def test_a_session_likely_back_within_the_turnover_time_is_kept():
    """Issue 38 (0.9M tokens, 32 users: session lost to LRU): p's expected remaining pause is long
    ((4 x 3 + 2 x 595) / 6 = 200 s: the 10-minute tail), b's 45 s, so ranking by expected time ranked
    p first to go, though 2 in 3 of p's pauses end within 3 s, and b cannot be back before its
    blocks would be gone anyway (an unused block lasts ~5 s here). Ranked by hits per second held
    over that horizon, b goes."""
    c = _short_person_pauses_and_a_slow_build()
    assert held(c, [1] * 4) == 2 and held(c, [2] * 4) == 0 and held(c, [3] * 8) == 4


def test_hit_density_over_the_horizon():
    from server.kvcache.retention import PauseEstimator

    est = PauseEstimator(cap_s=600.0)
    for pause in (8.0, 8.0, 8.0, 8.0, 600.0, 600.0):
        est.observe(("person",), pause)
    # waited 5 s: residuals 3 (x4) and 595 (x2); a block unused for 5 s is gone: 4 hits in 4x3 + 2x5 s
    assert est.hit_density(("person",), 5.0, 5.0) == 4 / 22
    # a horizon past every pause: 1 / the mean residual (the expected-time ranking)
    assert est.hit_density(("person",), 5.0, 1000.0) == 6 / (4 * 3 + 2 * 595)
    assert est.hit_density(("person",), 700.0, 5.0) == 0.0  # longer than every pause seen: gone


def test_equal_values_evict_the_latest_to_return_then_the_least_recently_active_first():
    """No session can be back within the horizon (1 s: all worth 0): the expected time to return
    decides, then LRU order; whole sessions from their tails."""
    from server.kvcache.retention import SessionRecords, session_eviction_order

    book = SessionRecords(capacity=8, cap_s=600.0)
    for _ in range(4):
        book.pauses.observe(("build",), 50.0)
        book.pauses.observe(("lint",), 40.0)
    sessions = {}
    for key, tool, since in (("late", "build", 95.0), ("new", "lint", 90.0), ("old", "build", 80.0)):
        s = sessions[key] = book.touch(key)[0]
        s.state, s.waiting_on, s.since = "tool", (tool,), since
        s.chain = [f"{key}{d}".encode() for d in range(2)]
    tier1 = {h: None for s in book.values() for h in s.chain}
    # at 100 s: late 45 s from back, new and old 30 s (40 - 10, 50 - 20): old is the less recent
    assert [book.time_to_return(sessions[k], 100.0) for k in ("late", "new", "old")] == [45.0, 30.0, 30.0]
    order = session_eviction_order(tier1, list(tier1), book, 100.0, 1.0)
    assert order == [b"late1", b"late0", b"old1", b"old0", b"new1", b"new0"]
