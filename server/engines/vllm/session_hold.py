"""Session-aware retention on vLLM: a KV connector that holds a paused session's cached blocks.

vLLM 0.32's prefix cache (``BlockPool``) returns a finished request's blocks to one free queue
and evicts them least recently used first. ``SessionHoldConnector`` is a scheduler-side KV
connector (vLLM's documented ``KVConnectorBase_V1`` interface, loaded by
``kv_transfer_config.kv_connector_module_path``; ``bind_gpu_block_pool`` hands it the block pool
"to inc/dec ref counts") that keeps one extra reference on the blocks of a session's finished
request, so the pool cannot evict them, until:

* the session's next request has been given its blocks and reused the whole held prefix
  (``update_state_after_alloc``: that request now holds it), or
* the hold expires (``hold_s`` from the request's hint, checked every scheduler step), or
* memory is short: before a waiting request could not be admitted, or a running one would be
  preempted (``has_pending_block_frees``), the oldest hold is released first. Released blocks go
  to the most-recently-used end of the free queue, so they are still evicted after every
  unheld block.

What a request asks for comes with it: ``session_id`` (vLLM's own per-request field) and a vLLM
KV hint (``kv_hints``, ``KvHintsEnvelope``) with one action of type ``HOLD_ACTION`` whose payload
is ``{"hold_s": seconds}``; ``hold_hint`` builds it (API side). At most ``max_share`` of the pool's
blocks are held at once (``kv_connector_extra_config``); older holds give way to newer ones.

No KV moves: the worker-side half does nothing. vllm is imported at module level: only vLLM's
connector factory (in its engine core) and ``VllmEngine`` import this module.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.logger import init_logger

HOLD_ACTION = "agentserve.session_hold"  # the KvHintAction type this connector reads
CONNECTOR = "SessionHoldConnector"
MODULE = "server.engines.vllm.session_hold"
log = init_logger(__name__)


def hold_hint(request_id: str, hold_s: float) -> Any:
    """The vLLM ``KvHintsEnvelope`` asking the connector to hold the request's blocks ``hold_s``."""
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

    action = KvHintAction(
        action_id="hold", action_type=HOLD_ACTION, action_version="1", payload={"hold_s": float(hold_s)}
    )
    return KvHintsEnvelope(protocol_version="1", message_id=request_id, actions=[action])


def hint_hold_s(kv_hints: Any) -> float:
    """Seconds the request asks its blocks to be held (0: none)."""
    for action in getattr(kv_hints, "actions", None) or ():
        if action.action_type == HOLD_ACTION:
            return max(0.0, float(action.payload.get("hold_s", 0.0)))
    return 0.0


def transfer_config(max_share: float) -> dict[str, Any]:
    """``kv_transfer_config`` for ``AsyncEngineArgs`` that installs the connector."""
    return {
        "kv_connector": CONNECTOR,
        "kv_connector_module_path": MODULE,
        "kv_role": "kv_producer",  # a role is required; nothing is produced or consumed
        "kv_connector_extra_config": {"max_share": max_share},
    }


@dataclass
class Hold:
    blocks: list[Any]  # KVCacheBlock, prefix order
    until: float  # time.monotonic() deadline


class SessionHoldConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]  # vllm is untyped
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self.max_share = float(extra.get("max_share", 0.5))
        self.block_size = int(vllm_config.cache_config.block_size)
        batched = getattr(vllm_config.scheduler_config, "max_num_batched_tokens", None)
        self.max_step_tokens = int(batched) if batched else 1 << 30
        self.pool: Any = None
        self.holds: OrderedDict[str, Hold] = OrderedDict()  # session id -> hold, oldest first
        self.held_total = 0  # blocks ever held (for logs and tests)
        self.released_for_room = 0  # holds released because memory was short

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # nothing is handed off: a preempted request is simply recomputed

    # -- scheduler side ------------------------------------------------------------------------
    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        self.pool = gpu_block_pool

    def held_blocks(self) -> int:
        return sum(len(h.blocks) for h in self.holds.values())

    def release(self, session: str) -> None:
        hold = self.holds.pop(session, None)
        if hold is not None and self.pool is not None:
            self.pool.free_blocks(reversed(hold.blocks))  # tail first: it is evicted before the head

    def expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for session in [s for s, h in self.holds.items() if h.until <= now]:
            self.release(session)

    def make_room(self, blocks_needed: int, keep: str | None = None) -> None:
        """Release holds, oldest first (``keep``'s last), until ``blocks_needed`` blocks are free."""
        if self.pool is None:
            return
        order = [s for s in self.holds if s != keep]
        if keep is not None and keep in self.holds:
            order.append(keep)
        for session in order:
            if self.pool.get_num_free_blocks() >= blocks_needed:
                return
            self.release(session)
            self.released_for_room += 1

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        """Called before a waiting request is admitted: make room for its next step, loads nothing."""
        self.expire()
        if self.holds:
            step = min(max(request.num_tokens - num_computed_tokens, 1), self.max_step_tokens)
            self.make_room(-(-step // self.block_size) + 1, keep=request.session_id)
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """The session is back: once its request holds the hold's last block (it reused the whole held
        prefix), the hold is no longer needed. A side request of the session (Claude Code sends its
        title and summary requests with the same session id) that shares less keeps it."""
        hold = self.holds.get(request.session_id) if request.session_id is not None else None
        if hold is not None and any(hold.blocks[-1] in group for group in blocks.blocks):
            self.release(request.session_id)

    def has_pending_block_frees(self) -> bool:
        """A running request is short of blocks: release the oldest hold instead of preempting."""
        if not self.holds:
            return False
        self.release(next(iter(self.holds)))
        self.released_for_room += 1
        return True

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        self.expire()
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Take one more reference on the request's cached blocks when it asks for a hold."""
        hold_s = hint_hold_s(request.kv_hints)
        session = request.session_id
        if hold_s <= 0 or session is None or self.pool is None:
            return False, None
        pool = self.pool
        blocks = [
            pool.blocks[i]
            for ids in block_ids
            for i in ids
            if not pool.blocks[i].is_null and pool.blocks[i].block_hash is not None
        ]
        cap = int(self.max_share * (pool.num_gpu_blocks - 1))
        blocks = blocks[:cap]
        previous = self.holds.pop(session, None)
        while self.holds and self.held_blocks() + len(blocks) > cap:
            self.release(next(iter(self.holds)))  # the oldest hold gives way
        if blocks:
            pool.touch(blocks)  # ref_cnt + 1 before the scheduler frees the request's own references
            self.holds[session] = Hold(blocks, time.monotonic() + hold_s)
            self.held_total += len(blocks)
        if previous is not None and pool is not None:
            pool.free_blocks(reversed(previous.blocks))
        return False, None

    def reset_cache(self) -> bool:
        for session in list(self.holds):
            self.release(session)
        return True

    # -- worker side: no KV moves ----------------------------------------------------------------
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None
