"""The benchmark report breaks hit-rate losses down by the miss type the server reported."""

from __future__ import annotations

from benchmarks.harness import report


def _rec(turn, prompt, cached, kind=None, label="v"):
    return {
        "label": label,
        "session": "s",
        "turn": turn,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "ttft_s": 0.1,
        "total_s": 0.2,
        "worker": None,
        "cache": {"type": kind, "reason": kind and f"because {kind}", "diverged_at_token": 3},
        "error": None,
    }


def test_losses_by_type_sum_to_the_hit_rate_loss():
    recs = [
        _rec(1, 100, 0, "first_request"),
        _rec(2, 200, 96),  # 4 tokens of tail
        _rec(3, 300, 32, "system_changed"),  # 168 lost
        _rec(4, 400, 0, "evicted"),  # 300 lost
    ]
    rows = report.summarize(recs)
    losses = report.loss_by_type(recs)["v"]
    assert losses == {"tail": 4, "system_changed": 168, "evicted": 300}
    ideal = 100 + 200 + 300
    assert 1 - rows[0]["hit_rate"] == sum(losses.values()) / ideal
    md = "\n".join(report.loss_lines(recs))
    assert "| v | 50.0 % | 28.0 % | 0.7 % |" in md and "| variant | evicted | system_changed | tail |" in md
    assert "system_changed, token 3" in report.first_reasons(recs)["v"]
