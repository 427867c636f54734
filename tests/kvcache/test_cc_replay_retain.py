"""``agentserve bench traces --retain``: the replay puts a prompt back into the cache when its reply
ends, as the hf engine's ``retain`` does (the engine held the KV while the reply ran). Kept here,
next to the policy it measures (tests/benchmarks is another owner's)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.cache import cc_traces


def write_trace(folder: Path, n: int, requests: list[tuple[float, int, float]]) -> None:
    """Trace ``n``: requests (t, prompt units, api seconds), each prompt the units 1..units."""
    body = {
        "id": f"trace_{n:04d}",
        "block_size": 64,
        "hash_id_scope": "local",
        "requests": [
            {
                "t": t,
                "type": "n",
                "in": 64 * u,
                "out": 10,
                "hash_ids": list(range(1, u + 1)),
                "stop": "tool_use",
                "api_time": api,
            }
            for t, u, api in requests
        ],
    }
    (folder / f"trace_{n:04d}.json").write_text(json.dumps(body))


def test_retain_brings_back_what_was_evicted_while_the_reply_ran(tmp_path: Path) -> None:
    """Trace 1's reply runs 20 s; trace 2's prompt arrives meanwhile and, in a cache of 60 units,
    evicts part of trace 1's 40. Without ``retain`` trace 1's next request finds what is left;
    with it, the whole prompt was put back at the reply's end."""
    write_trace(tmp_path, 1, [(0.0, 40, 20.0), (30.0, 44, 1.0)])
    write_trace(tmp_path, 2, [(0.0, 40, 1.0)])
    traces = cc_traces.load_traces(tmp_path)
    out = {}
    for retain in (False, True):
        cfg = cc_traces.Config(policy="lru", users=2, hbm_tokens=60 * 64, block_units=4, retain=retain)
        out[retain] = cc_traces.replay(traces, cfg)
    assert out[True]["retain"] is True and out[False]["retain"] is False
    units = 40 + 40 + 44
    assert round(out[True]["hit"] * units) == 40  # trace 1's whole previous prompt
    assert round(out[False]["hit"] * units) < 40
