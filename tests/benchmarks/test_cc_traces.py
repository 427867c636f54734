"""agentserve bench traces (issue 38): Claude Code traces replayed on the real prefix cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.cache import cc_traces
from benchmarks.run import main as bench_main

SAMPLE = Path(__file__).resolve().parents[2] / "benchmarks" / "traces" / "cc-sample"


def _request(t: float, ids: list[int], stop: str = "tool_use", api: float = 1.0) -> dict[str, object]:
    return {
        "t": t,
        "type": "n",
        "in": 64 * len(ids),
        "out": 100,
        "hash_ids": ids,
        "stop": stop,
        "api_time": api,
    }


def _write(folder: Path, n: int, requests: list[dict[str, object]]) -> None:
    body = {"id": f"trace_{n:04d}", "block_size": 64, "hash_id_scope": "local", "requests": requests}
    (folder / f"trace_{n:04d}.json").write_text(json.dumps(body))


def _last_json(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def test_the_ceiling_is_the_longest_prefix_an_earlier_request_had() -> None:
    reqs = (
        cc_traces.Request(0, (1, 2, 3), 1.0, True),
        cc_traces.Request(1, (1, 2, 3, 4, 5), 1.0, True),
        cc_traces.Request(2, (1, 2, 9, 4), 1.0, False),  # block 4 follows 9 now: another prefix
    )
    assert cc_traces.ceiling_units(cc_traces.Trace("t", reqs)) == 0 + 3 + 2


def test_the_ceiling_counts_a_sub_agent_reusing_its_parents_blocks(tmp_path: Path) -> None:
    """Sub-agents share their parent's id space: the ceiling is counted over it, so an unbounded
    cache's hit (which serves the sub-agent from the parent's blocks) is exactly the ceiling."""
    sub = {"t": 5.0, "type": "subagent", "requests": [_request(0.0, [1, 2, 7]), _request(1.0, [1, 2, 7, 8])]}
    _write(tmp_path, 1, [_request(0.0, [1, 2, 3]), sub, _request(9.0, [1, 2, 3, 4])])
    parent, child = cc_traces.load_trace(tmp_path / "trace_0001.json", 1)
    assert child.name.endswith("/sub0") and [r.t for r in child.requests] == [5.0, 6.0]
    assert cc_traces.ceiling_units(parent) + cc_traces.ceiling_units(child) == 3 + 3  # apart: 6
    assert cc_traces.ceiling_units(parent, child) == 3 + 2 + 3  # one id space: the sub-agent's 1, 2 too
    out = cc_traces.replay([parent, child], cc_traces.Config(users=2, hbm_tokens=10**8, policy="lru"))
    assert out["hit"] == out["ceiling"] and out["hit_share_of_ceiling"] == 1.0


def test_the_committed_sample_through_agentserve_bench(capsys: pytest.CaptureFixture[str]) -> None:
    """An unbounded cache serves exactly the ceiling: the replay looks up and inserts every prompt."""
    rc = bench_main(
        ["traces", "--traces", str(SAMPLE), "--users", "2", "--hbm-tokens", "10000000", "--policy", "lru"]
    )
    assert rc == 0
    out = _last_json(capsys)
    assert out["policy"] == "lru" and out["traces"] == 4 and out["requests"] == 13
    assert 0.5 < float(out["ceiling"]) < 1
    assert out["hit"] == out["ceiling"] and out["hit_share_of_ceiling"] == 1.0


def test_session_keeps_a_tool_paused_trace_that_lru_evicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Trace 1 pauses 30 s on a tool call; meanwhile one-request traces (ending on text) pass through
    a cache that holds about two prompts. LRU evicts the paused trace, the session policy keeps it."""
    _write(tmp_path, 1, [_request(0, list(range(1, 41))), _request(30, list(range(1, 45)), stop="end_turn")])
    for n in range(2, 32):
        _write(tmp_path, n, [_request(0, list(range(1, 41)), stop="end_turn")])
    hits = {}
    for policy in ("lru", "session"):
        cfg = cc_traces.Config(policy=policy, users=2, hbm_tokens=100 * 64, block_units=4)
        hits[policy] = cc_traces.replay(cc_traces.load_traces(tmp_path), cfg)
    assert hits["lru"]["hit"] == 0
    assert hits["session"]["hit"] > 0 and hits["session"]["hit_share_of_ceiling"] == 1.0
    assert hits["lru"]["ceiling"] == hits["session"]["ceiling"] > 0


def test_tier2_brings_back_what_tier1_evicted(tmp_path: Path) -> None:
    _write(tmp_path, 1, [_request(0, list(range(1, 41))), _request(30, list(range(1, 45)), stop="end_turn")])
    for n in range(2, 32):
        _write(tmp_path, n, [_request(0, list(range(1, 41)), stop="end_turn")])
    cfg = cc_traces.Config(
        policy="lru+tier2", users=2, hbm_tokens=100 * 64, host_tokens=10_000 * 64, block_units=4
    )
    out = cc_traces.replay(cc_traces.load_traces(tmp_path), cfg)
    assert (
        out["hit_share_of_ceiling"] == 1.0
        and int(out["bytes_from_tier2"]) == 40 * 64 * cc_traces.KV_BYTES_PER_TOKEN
    )


def test_fleet_affinity_keeps_each_trace_on_one_worker(tmp_path: Path) -> None:
    """Item 5: the router's own policies place the requests; affinity serves the ceiling from
    per-worker caches, round robin moves sessions and loses their prefix."""
    for n in range(1, 8):  # 7 traces over 4 workers: round robin does not line up with them
        ids = [list(range(1, 10 + 4 * j)) for j in range(5)]
        _write(tmp_path, n, [_request(10.0 * j, x) for j, x in enumerate(ids)])
    traces = cc_traces.load_traces(tmp_path)
    out = {}
    for routing in ("affinity", "round_robin"):
        cfg = cc_traces.Config(policy="lru", users=8, hbm_tokens=10**6, workers=4, routing=routing)
        out[routing] = cc_traces.replay(traces, cfg)
    assert out["affinity"]["hit_share_of_ceiling"] == 1.0 and out["affinity"]["sessions_moved"] == 0
    assert out["round_robin"]["sessions_moved"] > 0
    assert out["round_robin"]["hit"] < out["affinity"]["hit"]
    assert sum(out["affinity"]["requests_per_worker"]) == 35
