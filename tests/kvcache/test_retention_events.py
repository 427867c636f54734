"""Issue 38 item 4: the session policy follows request events, not only the clock.

On a slowed engine a session paused on its tool call comes back while two newer sessions'
requests are served slowly. Its request arrived early (the tool was quick, as the pauses
learned alone said) but waits for the engine; by the clock it has waited longer than every
pause seen and looked gone. The arrival event keeps it.
"""

from __future__ import annotations

from server.kvcache.prefix_cache import PrefixCache
from tests.kvcache.test_retention import Clock, held, make

SLOW_S = 5.0  # seconds each request takes on the slowed engine
TOOL_S = 1.0  # the tool's pause, as learned while the session ran alone
A = [1] * 8  # 4 blocks of 2 tokens
B, C = [2] * 8, [3] * 8


def _learned_alone() -> tuple[PrefixCache, Clock]:
    clock = Clock()
    c = PrefixCache(2, 9 * 10, policy="session", clock=clock)  # room for two sessions' prompts
    for k in range(4):  # the session alone: tool pauses of 1 s, its prompt growing
        ids = A[: 2 + 2 * k] if k < 3 else A
        c.match(ids, session="a")
        c.insert(ids, "", make, tail=True, session="a")
        c.reply_finished("a", ("shell",))
        clock.t += TOOL_S
    clock.t -= TOOL_S
    return c, clock


def _two_slow_requests_pass(c: PrefixCache, clock: Clock, arrived: bool) -> None:
    clock.t += TOOL_S * 1.5
    if arrived:
        c.request_arrived("a")  # the tool is done: a's request waits behind the slow ones
    for key, ids in (("b", B), ("c", C)):
        c.match(ids, session=key)
        clock.t += SLOW_S
        c.insert(ids, "", make, tail=True, session=key)
        c.reply_finished(key, ())


def test_a_session_whose_request_arrived_keeps_its_prefix_on_a_slowed_engine() -> None:
    c, clock = _learned_alone()
    _two_slow_requests_pass(c, clock, arrived=True)
    assert held(c, A) == 4
    m = c.match(A, session="a")
    assert m.cached_tokens == len(A)
    assert m.report is not None and m.report.evicted_tokens == 0 and m.report.state == "tool"
    # the pause learned is the tool's (1.5 s), not the wait behind the slow requests (11.5 s)
    assert c.sessions.pauses.snapshot()["shell"] < 1.5


def test_without_the_event_the_clock_alone_evicts_it() -> None:
    """What happened before (and still happens for an engine that does not say a request arrived)."""
    c, clock = _learned_alone()
    _two_slow_requests_pass(c, clock, arrived=False)
    assert held(c, A) < 4


def test_an_arrival_after_expiry_does_not_revive_the_session() -> None:
    c, clock = _learned_alone()
    clock.t += 10_000.0
    c.request_arrived("a")
    s = c.sessions.get("a")
    assert s is not None and s.arrived is None


def test_an_arrival_that_never_reaches_the_engine_holds_the_session_cap_s_at_most() -> None:
    c, clock = _learned_alone()
    clock.t += TOOL_S
    c.request_arrived("a")  # then the client went away before the engine took the request
    s = c.sessions.get("a")
    assert s is not None and not c.sessions.expired(s, clock.t + 599.0)
    assert c.sessions.expired(s, clock.t + 601.0)
