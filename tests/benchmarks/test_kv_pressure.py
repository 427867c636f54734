"""benchmarks/cache/kv_pressure.py: the --model option (random default, embedded = measured TTFT)."""

from __future__ import annotations

import json

import pytest

from benchmarks.cache import kv_pressure


def test_cache_only_with_a_real_model_is_refused() -> None:
    with pytest.raises(SystemExit) as exc:
        kv_pressure.main(["--cache-only", "--model", "embedded"])
    assert exc.value.code == 2


def test_unknown_model_is_refused() -> None:
    with pytest.raises(SystemExit):
        kv_pressure.main(["--model", "gpt"])


@pytest.mark.slow
def test_embedded_run_measures_ttft(tmp_path) -> None:
    """One session through the engine with the embedded weights: TTFT after a pause is measured (> 0),
    the reference rows are cache-only (0), and tier 2 under the cost model (restore auto) runs."""
    out = tmp_path / "kv"
    argv = ["--model", "embedded", "--sessions", "1", "--steps", "2", "--context", "4096", "--ratios", "4"]
    argv += ["--arms", "lru", "session+tier2", "--tier2-path", str(tmp_path / "t2"), "--out", str(out)]
    assert kv_pressure.main(argv) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["meta"]["model"] == "embedded" and data["meta"]["restore_default"] == "auto"
    rows = {(r["ratio"], r["arm"]): r for r in data["rows"]}
    assert rows[(0, "unbounded")]["ttft_after_pause_p50_ms"] == 0.0
    for arm in ("lru", "session+tier2"):
        assert rows[(4, arm)]["ttft_after_pause_p50_ms"] > 0.0
    assert "MEASURED" in out.with_suffix(".md").read_text()
