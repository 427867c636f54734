"""benchmarks/speed/gpu_batched_decode.py runs end to end on the tiny random shape on CPU: the script a
GPU session runs with its few device minutes must not break on an engine change first seen there
(the outbox's one-wake-up delivery broke its stand-in event loop, unnoticed for two sessions)."""

from __future__ import annotations

import json

from benchmarks.speed import gpu_batched_decode


def test_the_gpu_decode_benchmark_runs_on_the_tiny_shape(tmp_path):
    gpu_batched_decode.main(
        [
            "--shapes", "tiny", "--contexts", "48", "--batches", "1,3", "--steps", "2", "--warmup", "1",
            "--device", "cpu", "--check", "--out", str(tmp_path), "--name", "tiny",
        ]
    )  # fmt: skip
    rows = json.loads((tmp_path / "tiny.json").read_text())["rows"]
    assert [(r["batch"], r["context"]) for r in rows] == [(1, 48), (3, 48)]
    assert all(r["step_ms"] > 0 and r["forward_ms"] > 0 and r["ref_ms"] > 0 for r in rows)
    agree = rows[1]["bf16_rows_vs_alone"]  # fp32 on CPU: a batched row is the row alone
    assert agree["argmax_agree"] == 1.0 and agree["max_abs_diff"] < 1e-3
    assert "| tiny | 48 | 3 |" in (tmp_path / "tiny.md").read_text()
