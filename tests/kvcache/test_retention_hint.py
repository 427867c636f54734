"""A client's retention hint (Anthropic cache_control ttl, OpenAI prompt_cache_retention) keeps its
session's blocks past the policy's own expiry, up to ``session_cap_s``."""

from __future__ import annotations

import pytest

from server.kvcache.prefix_cache import PrefixCache

BLOCK = 10  # bytes per block payload
A, B, D = ([k] * 4 for k in (1, 2, 4))  # 2 blocks each (block size 2), no shared prefix


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def held(c: PrefixCache, ids: list[int]) -> int:
    return sum(h in c for h in c.block_hashes(ids))


def run(hint_a: float, idle_s: float) -> PrefixCache:
    """a (hint ``hint_a``), then b (no hint), both wait on a tool; ``idle_s`` later d needs room."""
    clock = Clock()
    c = PrefixCache(2, 4 * BLOCK, policy="session", clock=clock, session_cap_s=600.0)
    for session, ids, hint in (("a", A, hint_a), ("b", B, 0.0)):
        c.match(ids, session=session, retain_s=hint)
        c.insert(ids, "", lambda i: (f"kv{i}", BLOCK), tail=True, session=session)
        c.reply_finished(session, ("Read",))  # expected back in ~10 s: expired after 40 s
        clock.t += 1
    clock.t += idle_s
    c.match(D, session="d")
    c.insert(D, "", lambda i: (f"kv{i}", BLOCK), tail=True, session="d")  # 6 blocks > 4: two go
    return c


def test_without_a_hint_both_expire_and_the_older_goes_first():
    c = run(hint_a=0.0, idle_s=100.0)
    assert held(c, A) == 0 and held(c, B) == 2


def test_a_hinted_session_outlives_the_policys_expiry():
    c = run(hint_a=300.0, idle_s=100.0)
    assert held(c, A) == 2 and held(c, B) == 0
    report = c.last_lookup("d")
    assert report is not None and report.state == "new"


@pytest.mark.parametrize("idle_s", [350.0, 700.0])  # past the hint; past session_cap_s (a 24h hint)
def test_a_hint_ends_at_its_ttl_and_never_outlasts_the_cap(idle_s):
    c = run(hint_a=300.0 if idle_s < 600 else 86400.0, idle_s=idle_s)
    assert held(c, A) == 0 and held(c, B) == 2
