"""How a prefix-cache block is keyed: a chained hash that names the whole prefix.

A sequence is cut into blocks of ``block_size`` tokens; the last block may be partial (a
*tail*). Block i is keyed by H_i = blake2b(H_{i-1} || int64 token ids of block i), 16 bytes,
with H_{-1} = blake2b(salt) (the tenant's namespace), so a key names the whole prefix up to
and including that block (as in vLLM v1 and nano-vllm). Tier 2 checks a restored block's key
the same way.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def chain_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The chained hash of a block: blake2b(parent key || int64 token ids), 16 bytes."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()


def root_key(salt: str = "") -> bytes:
    """The parent key of a sequence's first block (``salt``: the prefix cache's namespace)."""
    return hashlib.blake2b(salt.encode(), digest_size=16).digest()


def block_keys(token_ids: Sequence[int], block_size: int, salt: str = "") -> list[bytes]:
    """Chained keys of every full block of ``token_ids``."""
    parent = root_key(salt)
    out: list[bytes] = []
    for i in range(len(token_ids) // block_size):
        parent = chain_key(parent, token_ids[i * block_size : (i + 1) * block_size])
        out.append(parent)
    return out
