"""Summaries (hit rate = cached / previous prompt), markdown, plots; the runner's TTFT rule; the CLI hook."""

from __future__ import annotations

import asyncio
import json

import httpx

from benchmarks.harness import report
from benchmarks.harness.runner import _first_output, timed_request


def _rec(label, turn, prompt, cached, ttft, session="s"):
    return {
        "label": label,
        "session": session,
        "turn": turn,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "ttft_s": ttft,
        "total_s": None if ttft is None else ttft + 0.1,
        "worker": None,
        "cache": None,
        "error": None,
    }


def test_hit_rate_is_cached_over_previous_prompt():
    recs = [
        _rec("a", 1, 100, 0, 1.0),
        _rec("a", 2, 150, 96, 0.2),
        _rec("a", 3, 200, 128, 0.3),
        _rec("b", 1, 100, 0, 1.0),
        _rec("b", 2, 150, 0, 1.5),
    ]
    rows = {r["label"]: r for r in report.summarize(recs, at_turn=2)}
    assert rows["a"]["hit_rate"] == (96 + 128) / (100 + 150)
    assert rows["b"]["hit_rate"] == 0.0
    assert rows["a"]["ttft_turn2_s"] == 0.2 and rows["a"]["prompt_turn2"] == 150
    assert rows["a"]["cached_share"] == 224 / 450


def test_sampled_turns_have_no_ideal_and_errors_are_counted():
    recs = [
        _rec("off", 1, 100, 0, 1.0),
        _rec("off", 10, 900, 0, 9.0),
        {**_rec("off", 20, 0, 0, None), "error": "x"},
    ]
    row = report.summarize(recs)[0]
    assert row["hit_rate"] is None and row["errors"] == 1 and row["requests"] == 3


def test_save_writes_json_markdown_and_two_plots(tmp_path):
    recs = [
        _rec(lbl, t, 100 * t, 90 * (t - 1) if lbl == "good" else 0, 0.1 * t)
        for lbl in ("good", "bad")
        for t in range(1, 6)
    ]
    recs[3]["cache"] = {"diverged_at_token": 3, "reason": "system message changed at character 0"}
    out = report.save("x", "Title", recs, {"model": "m", "command": "cmd"}, at_turn=3, out_dir=tmp_path)
    assert "| good |" in out["markdown"] and "system message changed" in out["markdown"]
    data = json.loads((tmp_path / "x.json").read_text())
    assert data["meta"]["model"] == "m" and len(data["records"]) == 10
    for suffix in ("_ttft.png", "_hit.png"):
        assert (tmp_path / f"x{suffix}").stat().st_size > 1000


def test_first_output_skips_the_role_chunk():
    assert not _first_output({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    assert _first_output({"choices": [{"delta": {"content": "Hi"}}]})
    assert _first_output({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]})
    assert _first_output({"choices": [{"delta": {}, "finish_reason": "length"}]})


def test_timed_request_reads_usage_cache_and_worker_from_a_stream():
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"content": "ok"}}]},
        {"choices": [{"delta": {}, "finish_reason": "stop"}], "cache": {"cached_tokens": 64, "reason": None}},
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 1,
                "prompt_tokens_details": {"cached_tokens": 64},
            },
        },
    ]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"

    def handler(request):
        return httpx.Response(
            200, text=body, headers={"X-Agentserve-Worker": "w1", "content-type": "text/event-stream"}
        )

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await timed_request(c, "http://x", {})

    rec = asyncio.run(go())
    assert rec["prompt_tokens"] == 100 and rec["cached_tokens"] == 64 and rec["worker"] == "w1"
    assert rec["cache"]["cached_tokens"] == 64 and rec["error"] is None and rec["ttft_s"] is not None


def test_timed_request_records_an_http_error():
    def handler(request):
        return httpx.Response(400, json={"error": {"message": "prompt too long"}})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await timed_request(c, "http://x", {})

    rec = asyncio.run(go())
    assert rec["status"] == 400 and rec["error"] == "prompt too long"


def test_cli_bench_dispatches_to_the_runner(capsys):
    from server.cli import main

    assert main(["bench", "--help"]) == 0
    assert "gpu-ttft" in capsys.readouterr().out


def test_same_worker_share_counts_consecutive_turns_on_one_worker():
    recs = [
        {**_rec("rr", t, 100 * t, 0, 0.1), "worker": w} for t, w in enumerate(["w0", "w1", "w1", "w2"], 1)
    ]
    assert report.summarize(recs)[0]["same_worker_share"] == 1 / 3
    assert report.summarize([_rec("x", 1, 1, 0, 0.1)])[0]["same_worker_share"] is None
