"""Both tiers stay within their budgets, and every hit serves the right tokens, under any operations.

Hypothesis draws sequences of operations (derandomized: tests/conftest.py) over a small
token alphabet so that prompts share prefixes, diverge inside blocks and come back.
A block's payload is a tensor of its own token ids, so a hit can be checked exactly.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from server.kvcache.cost_model import CostModel  # noqa: E402
from server.kvcache.prefix_cache import PrefixCache  # noqa: E402
from server.kvcache.tier2 import DiskStore, HostStore  # noqa: E402

BS = 4
BYTES_PER_TOKEN = 4  # float32 payload of the token ids

seqs = st.lists(st.integers(0, 2), min_size=1, max_size=30)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 4), seqs, st.booleans()),
        st.tuples(st.just("match"), st.integers(0, 4), seqs),
        st.tuples(st.just("reply"), st.integers(0, 4), st.sampled_from([(), ("shell",), ("file", "web")])),
        st.tuples(st.just("end"), st.integers(0, 4)),
        st.tuples(st.just("wait"), st.floats(0, 400)),
    ),
    max_size=60,
)


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def cutter(tokens):
    def make(i):
        t = torch.tensor(tokens[i * BS : (i + 1) * BS], dtype=torch.float32)
        return t, t.numel() * BYTES_PER_TOKEN

    return make


def check(c: PrefixCache, cap2: int) -> None:
    assert c.used_bytes <= c.capacity_bytes
    assert c.used_bytes == sum(b.nbytes for b in c.index.blocks.values() if b.tier == 1)
    if c.tier2 is not None:
        assert c.tier2.used_bytes <= cap2
        in_t2 = {h for h, b in c.index.blocks.items() if b.tier == 2}
        assert in_t2 == set(c.tier2.keys())
    for parent, kids in c.index.children.items():
        assert all(c.index.blocks[k].parent == parent for k in kids)


def run(operations, policy: str, store_kind: str, tmp_path=None) -> None:
    clock = Clock()
    cap2 = 40 * BYTES_PER_TOKEN
    store = None
    if store_kind == "host":
        store = HostStore(cap2)
    elif store_kind == "disk":
        store = DiskStore(cap2, tmp_path)
    c = PrefixCache(
        BS,
        24 * BYTES_PER_TOKEN,
        policy=policy,
        tier2=store,
        cost=CostModel("always"),
        clock=clock,
        session_cap_s=300,
    )
    for op in operations:
        kind = op[0]
        if kind == "insert":
            _, s, ids, tail = op
            c.insert(ids, "", cutter(ids), tail=tail, session=f"s{s}")
        elif kind == "match":
            _, s, ids = op
            m = c.match(ids, session=f"s{s}", max_tokens=len(ids) - 1)
            got = [int(x) for b, n in zip(m.blocks, m.lengths, strict=True) for x in b[:n].tolist()]
            assert got == ids[: m.cached_tokens] and m.cached_tokens <= len(ids) - 1
        elif kind == "reply":
            c.reply_finished(f"s{op[1]}", op[2])
        elif kind == "end":
            c.end_session(f"s{op[1]}")
        else:
            clock.t += op[1]
        check(c, cap2)


@pytest.mark.parametrize("policy", ["lru", "session"])
@pytest.mark.parametrize("store_kind", ["none", "host"])
@settings(max_examples=150, deadline=None)
@given(operations=ops)
def test_budgets_hold_and_hits_are_exact(operations, policy, store_kind):
    run(operations, policy, store_kind)


@settings(max_examples=25, deadline=None)
@given(operations=ops)
def test_budgets_hold_with_a_disk_tier(operations, tmp_path_factory):
    run(operations, "session", "disk", tmp_path_factory.mktemp("t2"))
