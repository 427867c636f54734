"""A transformers KV cache that appends in place instead of concatenating every step.

transformers' ``DynamicLayer`` grows by ``torch.cat`` on every forward: each decode step
copies the whole KV of every layer (at 3k tokens of SmolLM2-135M that is ~140 MB a token,
12.7 % of a CPU decode step, measured by benchmarks/speed/profile_hf.py). ``GrowingLayer`` keeps a
buffer with spare room and writes each step's keys/values into it; ``keys``/``values`` are
views of the filled part, so everything that reads a ``DynamicCache`` (attention, masks,
``BlockCutter``) sees the same tensors as before. When the room runs out the buffer grows
by a quarter (at least ``reserve`` tokens), so copies are amortised.

A layer may live in a slot of a ``kv_slots.KVSlots`` pool instead (``home``): its buffer is then
a view of the pool's row, so a batched decode step can attend over all running sequences at
once. A layer that would outgrow its row (or does not match the pool's shape) moves to a
buffer of its own, copying what it holds, and goes on as before.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# Spare tokens given to a buffer beyond what is asked of it when it is first made or grown.
DEFAULT_RESERVE = 256


class GrowingLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A ``DynamicLayer`` whose keys/values live in a buffer with spare room (see module doc).

    ``keys`` / ``values`` are views of the buffer's filled part made when read, not at every
    write: a pooled decode step advances every layer of every row, and remaking the views
    there took ~1.4 ms of an 8-row step (py-spy, concurrent_sessions.md). Assigning them
    (transformers' offload, reorder, batch selection) makes the given tensors the buffer,
    outside any pool.
    """

    _k: torch.Tensor | None = None
    _v: torch.Tensor | None = None
    _n = 0
    pool: Any = None  # the KVSlots this layer lives in (None: a buffer of its own)
    slot: int | None = None
    _plain: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)  # before the first append

    @property
    def keys(self) -> torch.Tensor | None:
        return self._plain[0] if self._k is None else self._k[:, :, : self._n]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        if self._k is None or value is None:
            self._plain = (value, self._plain[1])
        else:
            self._adopt(value, self._v)

    @property
    def values(self) -> torch.Tensor | None:
        return self._plain[1] if self._v is None else self._v[:, :, : self._n]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        if self._v is None or value is None:
            self._plain = (self._plain[0], value)
        else:
            self._adopt(self._k, value)

    def _adopt(self, k: torch.Tensor | None, v: torch.Tensor | None) -> None:
        """Tensors assigned from outside become the buffer, filled to their length (no pool row)."""
        self._k, self._v = k, v
        self._n = (k if k is not None else v).shape[-2]  # type: ignore[union-attr]
        self.pool = self.slot = None

    def __init__(self, reserve: int = DEFAULT_RESERVE) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.reserve = reserve  # buffer, length, pool and slot start as the class's defaults
        self.layer_idx = 0

    def home(self, pool: Any, slot: int, layer_idx: int) -> None:
        """Live in ``pool``'s row ``slot`` from the first append on (the layer must be empty)."""
        assert self._n == 0, "only an empty layer moves into the pool"
        self.pool, self.slot, self.layer_idx = pool, slot, layer_idx

    def rehome(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """The pool was reallocated: ``k``/``v`` are this layer's row in the new tensors."""
        if self.pool is None or self._k is None:
            return  # not in the pool, or not begun (the first append takes the row and checks it)
        self._k, self._v = k, v

    def _pool_row(self, key_states: torch.Tensor, need: int) -> bool:
        """Take the pool row as the buffer if it fits (the pool's rows may grow within its budget);
        else leave the pool: a buffer of one's own."""
        pool = self.pool
        same = bool(
            key_states.shape[1] == pool.kv_heads
            and key_states.shape[-1] == pool.head_dim
            and key_states.dtype == pool.dtype
            and key_states.device == pool.device
        )
        if same and (need <= pool.cap or pool.ensure(need)):
            self._k, self._v = pool.row(self.layer_idx, self.slot)
            return True
        self.pool = self.slot = None
        return False

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, need: int) -> None:
        if self.pool is not None and self._pool_row(key_states, need):
            return
        cap = max(need + self.reserve, need + need // 4)
        b, h, _, dk = key_states.shape
        k = key_states.new_empty((b, h, cap, dk))
        v = value_states.new_empty((b, h, cap, value_states.shape[-1]))
        if self._k is not None and self._v is not None and self._n:
            k[:, :, : self._n].copy_(self._k[:, :, : self._n])
            v[:, :, : self._n].copy_(self._v[:, :, : self._n])
        self._k, self._v = k, v

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Write new keys/values after the filled part (growing the buffer when full)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, add = self._n, key_states.shape[-2]
        if self._k is None or self._v is None or n + add > self._k.shape[-2]:
            self._grow(key_states, value_states, n + add)
        assert self._k is not None and self._v is not None
        self._k[:, :, n : n + add].copy_(key_states)
        self._v[:, :, n : n + add].copy_(value_states)
        self._n = n + add

    def filled(self, tokens: int) -> None:
        """This empty layer's pool row holds ``tokens`` tokens written from outside (``KVSlots.restore``)."""
        assert self._n == 0 and self.pool is not None and self.slot is not None
        k, v = self.pool.row(self.layer_idx, self.slot)
        if not self.is_initialized:
            self.lazy_initialization(k, v)
        self._k, self._v, self._n = k, v, tokens

    def advance(self, add: int) -> None:
        """``add`` tokens were written into this layer's pool row from outside (a pooled decode step)."""
        assert self._k is not None and self._v is not None
        self._n += add

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.append(key_states, value_states)
        assert self.keys is not None and self.values is not None
        if key_states.shape[-2] > 1:
            # a prefill chunk: attention of many queries over strided K/V views takes a slower SDPA
            # path on CPU (measured: TTFT 1.25x at 3k cached + 200 new); one contiguous copy is cheaper
            return self.keys.contiguous(), self.values.contiguous()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._n if self.is_initialized else 0

    def reset(self) -> None:
        self._k = self._v = None
        self._n = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if self._k is None or tokens_to_remove > 0:  # transformers' checks and messages
            super().crop(tokens_to_remove)
            return
        self._n = max(0, self._n - abs(tokens_to_remove))  # the buffer keeps its room


def restore(kv: DynamicCache, stacked: torch.Tensor) -> None:
    """Fill an empty cache with a prefix-cache match's KV, [layers, 2, kv_heads, tokens, head_dim]."""
    for i, layer in enumerate(kv.layers[: stacked.shape[0]]):
        keys, values = stacked[i, 0].unsqueeze(0), stacked[i, 1].unsqueeze(0)
        if isinstance(layer, GrowingLayer):
            layer.append(keys, values)  # no attention follows: no contiguous copy to return
        else:
            kv.update(keys, values, i)


def growing_cache(config: Any) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose full-attention layers append in place.

    Layers of other kinds (sliding window, linear attention) keep transformers' own class.
    """
    kv = DynamicCache(config=config)
    kv.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in kv.layers]
    return kv


def cache_kw(model: Any, kv: Any) -> dict[str, Any]:
    """``kv`` as the keyword ``model``'s forward takes: ``cache`` (transformers >= 5.2x, where
    ``past_key_values`` is deprecated, to be removed in 5.40) or ``past_key_values`` (older
    releases, e.g. the GPU machine's 5.17). Decided by the forward's signature, once per class."""
    return {_CACHE_KW.setdefault(type(model), _cache_name(model)): kv}


_CACHE_KW: dict[type, str] = {}


def _cache_name(model: Any) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
