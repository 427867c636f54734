"""KV slots: the running sequences' caches side by side, so a decode step is one attention call a layer.

Per layer one K and one V tensor ``[slots, kv_heads, cap, head_dim]``, all of them views of
ONE tensor ``[layers, 2, slots, kv_heads, cap, head_dim]`` (``kv``), so a slot's tokens of every
layer are one strided view: ``restore`` writes a prefix-cache block (``[layers, 2, kv_heads,
tokens, head_dim]``) there with one copy. A sequence admitted
at prefill gets a slot (the lowest free one) and its ``GrowingLayer`` buffers become views of
that slot's row: restore, prefill and decode write there in place, and everything that reads
the cache (attention, ``BlockCutter``) sees the same views as before. A batched decode step
(``model/rows.py`` ``decode_rows``) then writes the B new keys/values with one indexed store per
layer and runs ONE SDPA over rows ``lo..hi`` of the pool with a bool mask hiding each row's
padding, instead of one SDPA per sequence (measured in benchmarks/results/
concurrent_sessions.md).

Padding costs attention work and memory, so both are bounded: a step takes the pooled path
only while padded tokens stay within ``MAX_PADDING`` x the real ones (else each row runs alone
over its slot's views, as before), and the pool stays within ``budget_bytes``: a sequence that
would push it past is not admitted and keeps a buffer of its own. A sequence reserves its
prompt + ``HEADROOM`` tokens (or its ``max_tokens``, if fewer) at admission; when a row runs
out, the pool reallocates longer rows within the budget, and past the budget the sequence's
layers move to buffers of their own (copied once) and it decodes per row. The slot comes
back when the sequence's cache is dropped (``weakref.finalize``: never while anything still
reads it). New rows are zeroed: a masked position still multiplies its value row by 0, and
uninitialised memory could hold NaN. An empty pool keeps its memory for ``IDLE_RELEASE_S``
(``release_idle``, from the engine's idle loop): a burst of sessions after a tool pause reuses
it instead of growing it again (fresh memory is zeroed and page-faulted in: a 16-session burst
after the pool was given back waited 0.6-1.5 s for its first token instead of 0.2 s, measured
at 10 s; agents' tool pauses often pass 10 s, hence 60). ``expect`` lets a burst grow it once.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

import torch

# a step runs pooled while (rows spanned x longest) <= MAX_PADDING x (sum of the rows' lengths)
MAX_PADDING = 2.0
# tokens a sequence reserves past its prompt at admission; rows grow past that within the budget
HEADROOM = 256
# seconds an empty pool keeps its memory before giving it back
IDLE_RELEASE_S = 60.0


def kv_shape(config: Any) -> tuple[int, int, int]:
    """A transformers config's (layers, kv_heads, head_dim)."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return (
        int(config.num_hidden_layers),
        kv_heads,
        int(getattr(config, "head_dim", None) or config.hidden_size // heads),
    )


def kv_token_bytes(config: Any, dtype: torch.dtype) -> int:
    """Bytes of K and V a token takes over every layer."""
    layers, kv_heads, head_dim = kv_shape(config)
    return layers * 2 * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class KVSlots:
    """The pool (see module doc). ``admit`` homes a fresh cache's layers in a slot."""

    def __init__(self, config: Any, dtype: torch.dtype, device: torch.device, budget_bytes: int) -> None:
        self.n_layers, self.kv_heads, self.head_dim = kv_shape(config)
        self.dtype, self.device = dtype, device
        self.token_bytes = kv_token_bytes(config, dtype)
        self.budget_bytes = budget_bytes
        self.kv: torch.Tensor | None = None  # [layers, 2, slots, kv_heads, cap, head_dim]
        self.k: list[torch.Tensor] = []  # layer i's K: kv[i, 0]
        self.v: list[torch.Tensor] = []  # layer i's V: kv[i, 1]
        self.slots = 0  # rows allocated
        self.cap = 0  # tokens per row
        self.homes: dict[int, list[Any]] = {}  # slot -> the GrowingLayers living in it
        self._dropped: list[int] = []  # slots whose cache was dropped (a finalizer may run on any thread)
        self._empty_since: float | None = None  # when the last slot came back (monotonic clock)
        self.expected = 0  # sequences the engine expects to hold at once soon (``expect``)
        # admission, collection and release run on the engine thread, but ``HFEngine.prefill_logits``
        # (tests, in-process benchmarks) admits from its caller's thread while the idle loop may
        # release: each is one step under this lock (a release between an admission and its first
        # write left a row of 0 slots)
        self._lock = threading.RLock()

    def admit(self, kv: Any, need: int) -> int | None:
        """Give ``kv`` (a fresh ``growing_cache``) a slot for up to ``need`` tokens; None: stays private."""
        from server.engines.hf.kv.growing import GrowingLayer

        layers = list(kv.layers)
        if len(layers) != self.n_layers or not all(type(lay) is GrowingLayer for lay in layers):
            return None  # other layer kinds (sliding window, linear attention) keep their own class
        with self._lock:
            self.collect()
            slot = next((i for i in range(self.slots) if i not in self.homes), self.slots)
            if not self.fit(slot + 1, need):
                return None
            self.homes[slot] = layers
            for i, layer in enumerate(layers):
                layer.home(self, slot, i)
            weakref.finalize(kv, self._dropped.append, slot)
            return slot

    def expect(self, rows: int) -> None:
        """The engine holds ``rows`` sequences (running and queued): when the pool must grow for one
        of them it grows to that many rows at once (within the budget) instead of doubling once per
        admission. A burst of 16 after the pool was given back grew 1, 2, 4, 8, 16 rows, each a
        fresh zeroed pool and a copy of the old: ~0.45 s of the burst's first token (measured)."""
        self.expected = rows

    def ensure(self, tokens: int) -> bool:
        """Rows of at least ``tokens`` tokens (reallocated within the budget); False past it."""
        with self._lock:
            return self.fit(self.slots, tokens)

    def fit(self, slots: int, tokens: int) -> bool:
        """At least ``slots`` rows of ``tokens`` tokens: with spare room (rows doubled, tokens +1/4)
        when the budget allows, else exactly; False when even that would pass the budget. Another
        thread may admit or release: call it under the pool's lock (``ensure``, ``admit`` do)."""
        if slots <= self.slots and tokens <= self.cap:
            return True
        roomy = (
            max(slots, 2 * self.slots, self.expected) if slots > self.slots else self.slots,
            max(tokens, self.cap + self.cap // 4) if tokens > self.cap else self.cap,
        )
        for rows, cap in (roomy, (max(slots, self.slots), max(tokens, self.cap))):
            if rows * cap * self.token_bytes <= self.budget_bytes:
                self.resize(rows, cap)
                return True
        return False

    def row(self, layer: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot ``slot``'s K and V of layer ``layer``: views [1, kv_heads, cap, head_dim]."""
        return self.k[layer][slot : slot + 1], self.v[layer][slot : slot + 1]

    def resize(self, slots: int, cap: int) -> None:
        """A new zeroed pool of ``slots`` rows x ``cap`` tokens; the live caches' KV copied and rehomed."""
        kv = torch.zeros(
            (self.n_layers, 2, slots, self.kv_heads, cap, self.head_dim), dtype=self.dtype, device=self.device
        )
        if self.kv is not None:
            kv[:, :, : self.slots, :, : self.cap].copy_(self.kv)
        self.kv = kv
        self.k, self.v = list(kv[:, 0]), list(kv[:, 1])
        self.slots, self.cap = slots, cap
        for slot, layers in self.homes.items():
            for i, layer in enumerate(layers):
                layer.rehome(*self.row(i, slot))

    def restore(self, kv: Any, parts: list[torch.Tensor]) -> bool:
        """Write a prefix-cache match (``parts``: its blocks, each [layers, 2, kv_heads, tokens,
        head_dim]) into the empty cache ``kv``'s slot: one copy a block for all layers at once.

        False (nothing written) when ``kv`` does not live in the pool or the blocks do not fit
        its shape: the caller restores layer by layer. Concatenating the blocks and copying that
        layer by layer into the slot took 5x as long (SmolLM2-135M's KV, 16k tokens 298 -> 56 ms,
        4k 76 -> 15 ms; benchmarks/cache/restore_cpu.py, results/restore_cpu.md).
        """
        slot = self.slot_of(kv)
        tokens = sum(int(p.shape[3]) for p in parts)
        shape = (self.n_layers, 2, self.kv_heads, self.head_dim)
        if slot is None or not parts or any(lay.get_seq_length() for lay in kv.layers):
            return False
        if any(
            (p.shape[0], p.shape[1], p.shape[2], p.shape[4]) != shape or p.dtype != self.dtype for p in parts
        ):
            return False
        if not self.ensure(tokens):
            return False
        assert self.kv is not None
        dst = self.kv[:, :, slot]  # [layers, 2, kv_heads, cap, head_dim]
        at = 0
        for part in parts:
            n = int(part.shape[3])
            dst[:, :, :, at : at + n].copy_(part, non_blocking=True)
            at += n
        for lay in kv.layers:
            lay.filled(tokens)
        return True

    def collect(self) -> None:
        """Free the slots of dropped caches (their finalizers only queue them: any thread may run one)."""
        with self._lock:
            while self._dropped:
                slot = self._dropped.pop()
                self.homes.pop(slot, None)
            if self.homes or not self.slots:
                self._empty_since = None
            elif self._empty_since is None:  # nothing lives in the pool from now on
                self._empty_since = time.monotonic()

    def release_idle(self, after_s: float = IDLE_RELEASE_S) -> None:
        """Give the memory back once the pool has been empty ``after_s`` seconds (the engine's idle loop)."""
        with self._lock:
            self.collect()
            if self._empty_since is not None and time.monotonic() - self._empty_since >= after_s:
                self.kv, self.k, self.v, self.slots, self.cap = None, [], [], 0, 0
                self._empty_since = None

    def slot_of(self, kv: Any) -> int | None:
        """The slot every layer of ``kv`` lives in, or None (not admitted, or a layer moved out)."""
        slot = getattr(kv.layers[0], "slot", None)
        if slot is None or self.homes.get(slot) is None:
            return None
        if any(lay.slot != slot or lay.pool is not self for lay in kv.layers):
            return None
        return int(slot)


class PooledStep:
    """One batched decode step over the pool: rows, lengths after the step, the mask.

    ``rows[i]`` is sequence i's pool row relative to ``lo``; ``mask`` [span, 1, 1, longest]
    is 0 where a row attends (its own tokens, the new one included) and -inf elsewhere: an
    additive mask, made once a step (SDPA would turn a boolean one into it in every layer);
    None when the span has no padding (a batch of one: SDPA's unmasked kernels, flash on CUDA).
    ``shared`` > 0: the first ``shared`` tokens are the same in every row and the attention
    reads them once, from row ``source`` (shared_prefix.py); ``own_mask`` is ``mask`` past them.
    """

    def __init__(self, pool: KVSlots, slots: list[int], lengths: list[int], shared: int = 0) -> None:
        self.pool = pool
        self.lo = min(slots)
        span = max(slots) - self.lo + 1
        self.longest = max(lengths) + 1
        dev = pool.device
        self.slots = torch.tensor(slots, device=dev)
        self.positions = torch.tensor(lengths, device=dev)  # where each new token is written
        self.rows = self.slots - self.lo
        self.identity = slots == list(range(self.lo, self.lo + span))  # rows in slot order, no gaps
        after = torch.ones(span, dtype=torch.long, device=dev)  # rows outside the batch: token 0 only
        after[self.rows] = self.positions + 1
        self.mask: torch.Tensor | None = None  # no padding in the span (a batch of one): no mask
        if not (self.identity and len(set(lengths)) == 1):
            outside = torch.arange(self.longest, device=dev)[None, :] >= after[:, None]
            mask = torch.zeros(outside.shape, dtype=pool.dtype, device=dev)
            self.mask = mask.masked_fill_(outside, float("-inf"))[:, None, None, :]
        self.span = span
        self.shared = shared
        self.source = slots[0] - self.lo
        self.own_mask = None if self.mask is None or not shared else self.mask[..., shared:].contiguous()
        # the new keys/values land at flat rows of a layer's [slots * kv_heads * cap, head_dim] view
        heads = torch.arange(pool.kv_heads, device=dev)[None, :]
        flat = (self.slots[:, None] * pool.kv_heads + heads) * pool.cap + self.positions[:, None]
        self.flat = flat.reshape(-1)

    @staticmethod
    def fits(slots: list[int], lengths: list[int]) -> bool:
        """Whether padding stays within ``MAX_PADDING`` (else each row runs alone)."""
        span = max(slots) - min(slots) + 1
        return span * (max(lengths) + 1) <= MAX_PADDING * sum(n + 1 for n in lengths)

    def to_span(self, rows: torch.Tensor) -> torch.Tensor:
        """Row i of ``rows`` [B, ...] at its pool row of the span [span, ...] (zeros between)."""
        if self.identity:
            return rows
        return rows.new_zeros((self.span, *rows.shape[1:])).index_copy_(0, self.rows, rows)

    def from_span(self, spanned: torch.Tensor) -> torch.Tensor:
        """The batch's rows [B, ...] of a tensor over the span [span, ...] (``to_span`` undone)."""
        return spanned if self.identity else spanned.index_select(0, self.rows)

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the step's keys/values [B, kv_heads, 1, head_dim]; the K/V the attention reads."""
        k, v = self.pool.k[layer], self.pool.v[layer]
        dim = k.shape[-1]
        k.view(-1, dim).index_copy_(0, self.flat, keys.reshape(-1, dim))
        v.view(-1, dim).index_copy_(0, self.flat, values.reshape(-1, dim))
        hi = self.lo + self.span
        return k[self.lo : hi, :, : self.longest], v[self.lo : hi, :, : self.longest]
