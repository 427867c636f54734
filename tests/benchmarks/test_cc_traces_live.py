"""agentserve bench traces --mode live: block text, cache accounting and TTFT against the fake worker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from benchmarks.cache import cc_traces
from benchmarks.cache import cc_traces_live as live
from server.routing.fake_worker import create_fake_worker

NS = 1 << 32  # trace 1's id space


def _trace(name: str, *reqs: tuple[list[int], float]) -> live.LiveTrace:
    """A live trace from (hash ids, recorded pause before it) pairs, in its own id space
    (``trace_NNNN``: NNNN << 32, as load_trace does)."""
    ns = int(name.split("_")[1]) << 32
    rs = tuple(live.LiveRequest(tuple(ns + h for h in ids), pause, 4) for ids, pause in reqs)
    units = cc_traces.Trace(name, tuple(cc_traces.Request(i, r.units, 0.0, True) for i, r in enumerate(rs)))
    return live.LiveTrace(name, rs, cc_traces.ceiling_units(units))


def _run(app: FastAPI, traces: list[live.LiveTrace], cfg: live.LiveConfig) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, timeout=30) as client:
            return await live.run_arm(live.Arm("fake", "http://fake"), traces, cfg, client)

    return asyncio.run(go())


def test_a_block_is_the_same_k_words_wherever_it_sits() -> None:
    a, b = live.block_text(NS + 7, 3), live.block_text(NS + 8, 3)
    assert a == live.block_text(NS + 7, 3) and a != b
    assert a.startswith(" ") and len(a.split()) == 3 and all(w in live.WORDS for w in a.split())
    assert live.block_text(2 * NS + 7, 3) != a  # trace 2's id 7 is another block
    assert live.prompt_text([NS + 7, NS + 8], 3) == a + b


def test_block_boundaries_are_stable_in_the_embedded_tokenizer(tokenizer: Any) -> None:
    """Every block is K tokens in the real tokenizer, alone or after any other: a prompt of n
    blocks is n x K tokens and its first m blocks tokenize as a prefix of it."""
    units = [NS + h for h in range(200)]
    for k in (1, 2, 4):
        ids = tokenizer.encode(live.prompt_text(units, k), add_special_tokens=False)
        assert len(ids) == 200 * k
        head = tokenizer.encode(live.prompt_text(units[:37], k), add_special_tokens=False)
        assert ids[: len(head)] == head


def test_an_unbounded_cache_serves_the_ceiling_and_the_counts_add_up() -> None:
    """The fake worker caches whitespace tokens in blocks of 2 (= K): with room for everything its
    cached tokens are exactly the scaled prompts' ceiling; a request after a 100 s pause returns."""
    app = create_fake_worker("w", block_size=2)
    t = _trace("trace_0001", ([1, 2, 3], 0.0), ([1, 2, 3, 4, 5], 100.0), ([1, 2, 3, 4, 5, 6], 5.0))
    u = _trace("trace_0002", ([1, 2], 0.0), ([9, 2], 1.0))  # its ids 1, 2 are not trace 1's
    out = _run(app, [t, u], live.LiveConfig(users=2, time_scale=0.0, tokens_per_block=2))
    assert out["requests"] == 5 and out["errors"] == 0 and out["token_mismatch"] == 0
    assert out["block_tokens"] == out["prompt_tokens"] == 2 * (3 + 5 + 6 + 2 + 2)
    assert out["cached_tokens"] == 2 * (3 + 5)
    assert out["ceiling"] == round(8 / 18, 5) and out["hit_share_of_ceiling"] == 1.0
    assert out["returning_requests"] == 1 and out["returning_hit"] == 0.6  # 3 of its 5 blocks
    assert out["returning_ttft_p50_ms"] is not None and out["returning_ttft_p99_ms"] is not None
    sessions = [r["session"] for r in app.state.engine.log]
    assert sorted(set(sessions)) == ["trace_0001", "trace_0002"]  # each trace its own session


def test_an_evicting_cache_falls_short_of_the_ceiling_and_a_miss_is_slower() -> None:
    """Room for 3 blocks of 2 tokens: the second trace's prompts push the first's out (LRU), so
    its return after the pause recomputes; TTFT counts the prefill (10 ms per uncached token)."""
    app = create_fake_worker("w", block_size=2, cache_blocks=3, prefill_s_per_token=0.01)
    t = _trace("trace_0001", ([1, 2, 3], 0.0), ([1, 2, 3, 4], 600.0))
    u = _trace("trace_0002", ([11, 12, 13], 0.0), ([11, 12, 13], 0.0))
    cfg = live.LiveConfig(users=1, time_scale=0.0, tokens_per_block=2)
    out = _run(app, [u, t], cfg)  # users=1: trace 2 then trace 1, back to back
    assert out["ceiling"] == round(6 / 13, 5)
    assert out["cached_tokens"] == 6 + 6  # trace 2's repeat; trace 1's return: its 3 blocks still there
    # users=2: trace 2 runs while trace 1 pauses (600 s x 0.0005), whichever prefills first
    cfg = live.LiveConfig(users=2, time_scale=0.0005, tokens_per_block=2)
    app = create_fake_worker("w", block_size=2, cache_blocks=3, prefill_s_per_token=0.01)
    out = _run(app, [t, u], cfg)
    assert out["returning_requests"] == 1 and out["returning_hit"] == 0.0  # trace 1's return missed
    assert out["cached_tokens"] <= 6 and out["hit_share_of_ceiling"] <= 0.5
    assert out["returning_ttft_p50_ms"] >= 80  # its 8 tokens of prefill


def test_errors_and_missing_cached_tokens_are_counted_not_raised() -> None:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"data": [{"id": "m"}]})

    @app.post("/v1/completions")
    async def completions() -> JSONResponse:
        return JSONResponse({"error": {"message": "busy"}}, status_code=503)

    out = _run(app, [_trace("trace_0001", ([1], 0.0), ([1, 2], 1.0))], live.LiveConfig(time_scale=0.0))
    assert out["requests"] == 2 and out["errors"] == 2 and "503" in out["first_error"]
    assert out["hit"] == 0.0 and out["ttft_p50_ms"] is None


def test_scaling_keeps_every_sth_block_and_cuts_prompts(tmp_path: Path) -> None:
    reqs = [
        {"t": 0.0, "in": 640, "out": 50, "hash_ids": list(range(1, 11)), "stop": "tool_use", "api_time": 2.0},
        {
            "t": 100.0,
            "in": 768,
            "out": 3,
            "hash_ids": list(range(1, 13)),
            "stop": "end_turn",
            "api_time": 1.0,
        },
    ]
    body = {"id": "trace_0003", "block_size": 64, "hash_id_scope": "local", "requests": reqs}
    (tmp_path / "trace_0003.json").write_text(json.dumps(body))
    cfg = live.LiveConfig(block_stride=3, max_blocks=3)
    traces = cc_traces.load_traces(tmp_path)
    (t,) = live.scale_traces(traces, live.recorded_out(tmp_path, 0, 10), cfg)
    base = 3 << 32
    assert [r.units for r in t.requests] == [(base + 1, base + 4, base + 7)] * 2
    assert [r.pause_s for r in t.requests] == [0.0, 98.0] and [r.out_tokens for r in t.requests] == [50, 3]
    assert t.ceiling_blocks == 3


def test_live_mode_needs_a_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cc_traces.main(["--traces", str(tmp_path), "--mode", "live"]) == 2
    assert "--url" in capsys.readouterr().err


def test_the_block_ceiling_rounds_each_reuse_down_to_whole_blocks() -> None:
    """A server that caches whole blocks and computes the last prompt token (vLLM) serves at most
    min(prefix, prompt - 1) rounded down to its block, per request."""
    t = _trace("trace_0001", ([1, 2, 3], 0.0), ([1, 2, 3, 4], 1.0), ([1, 2, 3, 4], 1.0), ([5], 1.0))
    assert t.ceiling_prefixes() == [0, 3, 4, 0] and sum(t.ceiling_prefixes()) == t.ceiling_blocks
    assert live.block_ceiling_tokens([t], 2, 4) == 4 + 4  # 6 -> 4; min(8, 7) = 7 -> 4
    assert live.block_ceiling_tokens([t], 2, 1) == 6 + 7
    app = create_fake_worker("w", block_size=2)
    out = _run(app, [t], live.LiveConfig(time_scale=0.0, tokens_per_block=2, server_block=4))
    assert out["server_block"] == 4 and out["block_ceiling"] == round(8 / 24, 5)


def test_a_retention_hint_is_sent_scaled_only_when_asked(tmp_path: Path) -> None:
    """``--hints both``: every arm runs without, then with ``cache_retention_s`` = hint x time
    scale (the pauses it must cover are scaled too); the JSON lines say which."""
    bodies: list[dict[str, Any]] = []
    sessions: list[str] = []
    app = create_fake_worker("w", block_size=2, cache_blocks=64)

    @app.middleware("http")
    async def record(request: Any, call_next: Any) -> Any:
        if request.url.path == "/v1/completions":
            bodies.append(json.loads(await request.body()))
            sessions.append(request.headers["x-session-id"])
        return await call_next(request)

    cfg = live.LiveConfig(time_scale=0.01, tokens_per_block=2, hint_s=300.0)
    assert cfg.retention_s() == 3.0
    _run(app, [_trace("trace_0001", ([1, 2], 0.0))], cfg)
    _run(app, [_trace("trace_0001", ([1, 2], 0.0))], live.LiveConfig(time_scale=0.01, tokens_per_block=2))
    assert [b.get("cache_retention_s") for b in bodies] == [3.0, None]
    # the hinted pass has its own texts: it cannot hit what an unhinted pass left cached
    hinted, plain = (b["prompt"] for b in bodies)
    assert hinted != plain and len(hinted.split()) == len(plain.split()) == 4
    assert plain == live.prompt_text([NS + 1, NS + 2], 2)
    assert sessions == ["trace_0001-hinted", "trace_0001"]  # nor any session state


def test_hints_both_runs_every_arm_without_then_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = {"id": "trace_0001", "block_size": 64, "hash_id_scope": "local"}
    trace["requests"] = [{"t": 0.0, "in": 64, "out": 1, "hash_ids": [1], "stop": "end_turn", "api_time": 1.0}]
    (tmp_path / "trace_0001.json").write_text(json.dumps(trace))
    seen: list[tuple[str, float]] = []

    async def fake_arm(arm: live.Arm, traces: Any, cfg: live.LiveConfig) -> dict[str, Any]:
        seen.append((arm.name, cfg.hint_s))
        return {"arm": arm.name}

    monkeypatch.setattr(live, "run_arm", fake_arm)
    out = tmp_path / "out.jsonl"
    argv = ["--traces", str(tmp_path), "--mode", "live", "--url", "a=http://a", "--url", "b=http://b"]
    assert cc_traces.main([*argv, "--hints", "both", "--time-scale", "0.1", "--json", str(out)]) == 0
    assert seen == [("a", 0.0), ("b", 0.0), ("a", 300.0), ("b", 300.0)]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["arm"], x["hint_s"], x["retention_s_sent"]) for x in lines] == [
        ("a", 0.0, 0.0),
        ("b", 0.0, 0.0),
        ("a", 300.0, 30.0),
        ("b", 300.0, 30.0),
    ]
