"""The prefix cache's index of blocks, both tiers: keys, parents, children, tier-1 LRU order, bytes.

A block is known by its chained key (``block_keys.chain_key``) and records its parent key,
its tokens, its size and, while in tier 1, its payload. Children are indexed by parent
so a lookup can find the cached block sharing the most tokens with a prompt's next
tokens. ``PrefixCache`` owns one (``cache.index``) and shares it with its ``tiers.Tiers``;
nothing here decides what to keep.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any


@dataclass
class Block:
    parent: bytes
    tokens: tuple[int, ...]
    nbytes: int
    payload: Any = None  # None while the block is in tier 2
    tier: int = 1


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class BlockIndex:
    """Blocks by key (both tiers), children by parent, tier-1 LRU order and bytes.

    A part of ``PrefixCache`` (``cache.index``), shared with its ``Tiers``; callers hold the
    cache's lock. ``blocks`` and ``children`` are for reading: change them through the methods.
    """

    def __init__(self) -> None:
        self.blocks: dict[bytes, Block] = {}  # both tiers
        # tier-1 keys -> when last used (the cache's clock), least recently used first
        self.lru: OrderedDict[bytes, float] = OrderedDict()
        self.children: dict[bytes, dict[bytes, None]] = {}
        self._bytes = 0  # tier-1 bytes

    def link(
        self, h: bytes, parent: bytes, tokens: tuple[int, ...], payload: Any, nbytes: int, now: float = 0.0
    ) -> Block:
        """A new tier-1 block (most recently used, at ``now``)."""
        blk = self.blocks[h] = Block(parent, tokens, nbytes, payload)
        self.children.setdefault(parent, {})[h] = None
        self.lru[h] = now
        self._bytes += nbytes
        return blk

    def unlink(self, h: bytes) -> Block | None:
        """Forget block ``h`` (either tier); the block, or None when it was not known."""
        blk = self.blocks.pop(h, None)
        if blk is None:
            return None
        kids = self.children.get(blk.parent)
        if kids is not None:
            kids.pop(h, None)
            if not kids:
                del self.children[blk.parent]
        if blk.tier == 1:
            self.lru.pop(h, None)
            self._bytes -= blk.nbytes
        return blk

    def to_tier1(self, h: bytes, payload: Any, now: float = 0.0) -> None:
        """Block ``h`` (in tier 2) is back in tier 1 with ``payload``: counted, most recently used."""
        blk = self.blocks[h]
        blk.payload, blk.tier = payload, 1
        self.lru[h] = now
        self._bytes += blk.nbytes

    def to_tier2(self, h: bytes) -> Any:
        """Block ``h`` leaves tier 1 (its payload goes to tier 2): returns the payload."""
        blk = self.blocks[h]
        self.lru.pop(h)
        self._bytes -= blk.nbytes
        payload, blk.payload, blk.tier = blk.payload, None, 2
        return payload

    def duplicates_of(self, parent: bytes, tokens: tuple[int, ...]) -> list[bytes]:
        """Shorter siblings whose tokens ``tokens`` starts with (a new block makes them redundant)."""
        out = []
        for child in self.children.get(parent, ()):
            ct = self.blocks[child].tokens
            if len(ct) < len(tokens) and tokens[: len(ct)] == ct:
                out.append(child)
        return out

    def covering_sibling(self, parent: bytes, tokens: tuple[int, ...]) -> bytes | None:
        """A child of ``parent`` whose tokens start with ``tokens`` (it holds their KV already)."""
        for child in self.children.get(parent, ()):
            ct = self.blocks[child].tokens
            if len(ct) >= len(tokens) and ct[: len(tokens)] == tokens:
                return child
        return None

    def best_child(self, parent: bytes, rest: Sequence[int], skip: bytes) -> tuple[bytes | None, int]:
        """The child of ``parent`` sharing the most leading tokens with ``rest``, and how many."""
        best, best_n = None, 0
        for child in self.children.get(parent, ()):
            if child == skip:
                continue
            n = lcp(self.blocks[child].tokens, rest)
            if n > best_n:
                best, best_n = child, n
        return best, best_n

    def touch(self, keys: Sequence[bytes], now: float = 0.0) -> None:
        for h in reversed(keys):  # tail first, so the head ends most recently used
            if h in self.lru:
                self.lru.move_to_end(h)
                self.lru[h] = now

    def lru_age(self, now: float) -> float:
        """Seconds since the least recently used tier-1 block was used (0 when tier 1 is empty):
        how long an unused block lasts in tier 1 under LRU, the cache's turnover time."""
        for h in self.lru:
            return max(now - self.lru[h], 0.0)
        return 0.0

    # -- introspection ----------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        return self._bytes

    def tier_of(self, block_hash: bytes) -> int | None:
        blk = self.blocks.get(block_hash)
        return None if blk is None else blk.tier

    def __len__(self) -> int:
        return len(self.lru)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.lru

    def snapshot(self) -> Any:
        """The tier-1 contents, for ``restore`` (paired benchmark runs; tier 2 is not included)."""
        blocks = {h: replace(b) for h, b in self.blocks.items() if b.tier == 1}
        kids = {p: dict(c) for p, c in self.children.items()}
        return blocks, self.lru.copy(), kids, self._bytes

    def restore(self, snap: Any) -> None:
        blocks, lru, kids, nbytes = snap
        self.blocks = {h: replace(b) for h, b in blocks.items()}
        self.lru, self._bytes = lru.copy(), nbytes
        self.children = {p: {h: None for h in c if h in self.blocks} for p, c in kids.items()}

    def clear(self) -> None:
        self.blocks.clear()
        self.lru.clear()
        self.children.clear()
        self._bytes = 0
