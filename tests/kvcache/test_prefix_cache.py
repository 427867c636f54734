"""Prefix cache units with exact block ids: reuse, partial tail, eviction order, budget."""

from __future__ import annotations

from server.kvcache.prefix_cache import PrefixCache


def payload(nbytes: int = 10):
    calls: list[int] = []

    def make(i: int):
        calls.append(i)
        return (f"kv{i}", nbytes)

    return make, calls


def test_chained_hashes_name_the_whole_prefix():
    c = PrefixCache(block_size=4, capacity_bytes=1000)
    a = c.block_hashes(list(range(12)))
    b = c.block_hashes([99] + list(range(1, 12)))
    assert len(a) == 3 and len(set(a)) == 3
    # a change in block 0 changes every later key, even where the block's own tokens agree
    assert all(x != y for x, y in zip(a, b, strict=True))
    assert c.block_hashes(list(range(12)), salt="tenant-b") != a
    assert c.block_hashes(list(range(11))) == a[:2]  # partial tail block has no key


def test_reuse_longest_chain_and_partial_tail():
    c = PrefixCache(block_size=4, capacity_bytes=1000)
    make, calls = payload()
    assert c.insert(list(range(10)), "", make) == 2  # 2 full blocks, tail of 2 tokens not cached
    assert calls == [0, 1]
    m = c.match(list(range(10)) + [50, 51, 52])
    assert m.cached_tokens == 8 and m.blocks == ("kv0", "kv1")
    # diverging inside block 1 keeps block 0 and the 2 tokens of block 1 before the change
    m = c.match([0, 1, 2, 3, 4, 5, 99, 7, 8])
    assert m.blocks == ("kv0", "kv1") and m.lengths == (4, 2) and m.cached_tokens == 6
    # re-inserting a longer prompt computes only the new blocks
    make2, calls2 = payload()
    assert c.insert(list(range(16)), "", make2) == 2
    assert calls2 == [2, 3]
    assert c.match(list(range(16)), max_blocks=3).cached_tokens == 12


def test_salt_isolates_namespaces():
    c = PrefixCache(block_size=4, capacity_bytes=1000)
    make, _ = payload()
    c.insert(list(range(8)), "tenant-a", make)
    assert c.match(list(range(8)), "tenant-a").cached_tokens == 8
    assert c.match(list(range(8)), "tenant-b").cached_tokens == 0


def test_eviction_is_lru_and_trims_chains_from_the_tail():
    c = PrefixCache(block_size=2, capacity_bytes=40)  # 4 blocks of 10 bytes
    make, _ = payload()
    a = [1, 1, 2, 2, 3, 3]  # chain A: 3 blocks
    b = [7, 7, 8, 8]  # chain B: 2 blocks
    c.insert(a, "", make)
    ha = c.block_hashes(a)
    c.insert(b, "", make)  # 5 blocks > 4: the LRU block goes, which is A's tail
    hb = c.block_hashes(b)
    assert ha[2] not in c and ha[0] in c and ha[1] in c
    assert all(h in c for h in hb)
    assert c.used_bytes == 40 and c.evictions == 1
    # touching A makes B the LRU chain; inserting more evicts B's tail first
    assert c.match(a).cached_tokens == 4
    c.insert([5, 5], "", make)
    assert hb[1] not in c and hb[0] in c
    assert c.match(a).cached_tokens == 4 and c.match(b).cached_tokens == 2


def test_memory_budget_is_respected():
    c = PrefixCache(block_size=1, capacity_bytes=35)
    make, calls = payload(nbytes=10)
    c.insert(list(range(10)), "", make)
    assert calls == [0, 1, 2]  # the chain alone cannot exceed the budget: no wasted copies
    assert c.used_bytes <= 35 and len(c) == 3
    for start in range(100, 140, 3):
        c.insert(list(range(start, start + 3)), "", payload()[0])
        assert c.used_bytes <= 35


def test_disabled_cache_never_hits():
    c = PrefixCache(block_size=4, capacity_bytes=1000, enabled=False)
    make, calls = payload()
    assert c.insert(list(range(8)), "", make) == 0 and calls == []
    assert c.match(list(range(8))).cached_tokens == 0
