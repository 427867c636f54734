"""The prefix cache's index of blocks, both tiers: keys, parents, children, tier-1 LRU order, bytes.

A block is known by its chained key (``kv_tier2.chain_key``) and records its parent key,
its tokens, its size and, while in tier 1, its payload. Children are indexed by parent
so a lookup can find the cached block sharing the most tokens with a prompt's next
tokens. ``kv_tiers.TieredIndex`` and ``PrefixCache`` build on this; nothing here decides
what to keep.
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
    def __init__(self) -> None:
        self._blocks: dict[bytes, Block] = {}  # both tiers
        self._lru: OrderedDict[bytes, None] = OrderedDict()  # tier-1 keys, least recently used first
        self._children: dict[bytes, dict[bytes, None]] = {}
        self._bytes = 0  # tier-1 bytes

    def _link(self, h: bytes, parent: bytes, tokens: tuple[int, ...], payload: Any, nbytes: int) -> Block:
        blk = self._blocks[h] = Block(parent, tokens, nbytes, payload)
        self._children.setdefault(parent, {})[h] = None
        self._lru[h] = None
        self._bytes += nbytes
        return blk

    def _unlink(self, h: bytes) -> Block | None:
        blk = self._blocks.pop(h, None)
        if blk is None:
            return None
        kids = self._children.get(blk.parent)
        if kids is not None:
            kids.pop(h, None)
            if not kids:
                del self._children[blk.parent]
        if blk.tier == 1:
            self._lru.pop(h, None)
            self._bytes -= blk.nbytes
        return blk

    def _duplicates_of(self, parent: bytes, tokens: tuple[int, ...]) -> list[bytes]:
        """Shorter siblings whose tokens ``tokens`` starts with (a new block makes them redundant)."""
        out = []
        for child in self._children.get(parent, ()):
            ct = self._blocks[child].tokens
            if len(ct) < len(tokens) and tokens[: len(ct)] == ct:
                out.append(child)
        return out

    def _covering_sibling(self, parent: bytes, tokens: tuple[int, ...]) -> bytes | None:
        for child in self._children.get(parent, ()):
            ct = self._blocks[child].tokens
            if len(ct) >= len(tokens) and ct[: len(tokens)] == tokens:
                return child
        return None

    def _best_child(self, parent: bytes, rest: Sequence[int], skip: bytes) -> tuple[bytes | None, int]:
        """The child of ``parent`` sharing the most leading tokens with ``rest``, and how many."""
        best, best_n = None, 0
        for child in self._children.get(parent, ()):
            if child == skip:
                continue
            n = lcp(self._blocks[child].tokens, rest)
            if n > best_n:
                best, best_n = child, n
        return best, best_n

    def _touch(self, keys: Sequence[bytes]) -> None:
        for h in reversed(keys):  # tail first, so the head ends most recently used
            if h in self._lru:
                self._lru.move_to_end(h)

    # -- introspection ----------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        return self._bytes

    def tier_of(self, block_hash: bytes) -> int | None:
        blk = self._blocks.get(block_hash)
        return None if blk is None else blk.tier

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._lru

    def snapshot(self) -> Any:
        """The tier-1 contents, for ``restore`` (paired benchmark runs; tier 2 is not included)."""
        blocks = {h: replace(b) for h, b in self._blocks.items() if b.tier == 1}
        kids = {p: dict(c) for p, c in self._children.items()}
        return blocks, self._lru.copy(), kids, self._bytes

    def restore(self, snap: Any) -> None:
        blocks, lru, kids, nbytes = snap
        self._blocks = {h: replace(b) for h, b in blocks.items()}
        self._lru, self._bytes = lru.copy(), nbytes
        self._children = {p: {h: None for h in c if h in self._blocks} for p, c in kids.items()}

    def _clear_index(self) -> None:
        self._blocks.clear()
        self._lru.clear()
        self._children.clear()
        self._bytes = 0
