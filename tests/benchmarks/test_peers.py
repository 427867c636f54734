"""``bench peers`` end to end against two fake OpenAI servers (no model, no vLLM): the harness
sends the same workloads to each, and the report tells the good server from the bad one."""

from __future__ import annotations

import contextlib
import json
import threading

import pytest

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from fastapi.responses import JSONResponse, StreamingResponse  # noqa: E402

from server.ports import free_port, wait_for_health  # noqa: E402


def _value(schema):
    t = schema.get("type")
    if "enum" in schema:
        return schema["enum"][0]
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}.get(t, "x")


def fake_app(good: bool, arrivals: list | None = None):
    """good: caches the whole previous prompt of a session and writes schema-valid calls;
    bad: caches nothing and leaks a half call into content. ``arrivals`` collects
    (server, session key, messages) of every chat request, in order."""
    app = fastapi.FastAPI()
    seen: dict[str, int] = {}

    @app.get("/health")
    def health():
        return {"ok": True}

    @app.get("/v1/models")
    def models():
        return {"data": [{"id": "fake", "max_model_len": 8192}]}

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        prompt = len(json.dumps(body["messages"])) // 4 + len(json.dumps(body.get("tools") or [])) // 4
        key = body.get("prompt_cache_key", "")
        if arrivals is not None:
            arrivals.append(("good" if good else "bad", key, len(body["messages"])))
        cached = min(seen.get(key, 0), prompt) if good else 0
        seen[key] = prompt
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if body.get("stream"):

            def chunks():
                for delta, fin in (({"role": "assistant"}, None), ({"content": "ok"}, None), ({}, "stop")):
                    chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": fin}]}
                    yield f"data: {json.dumps(chunk)}\n\n"
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")
        tool = body["tools"][0]["function"]
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "function":
            tool = next(
                t["function"] for t in body["tools"] if t["function"]["name"] == choice["function"]["name"]
            )
        params = tool.get("parameters") or {}
        args = {k: _value(params["properties"][k]) for k in params.get("required", [])}
        if good:
            msg = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": tool["name"], "arguments": json.dumps(args)},
                    }
                ],
            }
            fin = "tool_calls"
        else:
            msg = {"role": "assistant", "content": '<tool_call>\n{"name": "' + tool["name"] + '", "argu'}
            fin = "length"
        return JSONResponse({"choices": [{"index": 0, "message": msg, "finish_reason": fin}], "usage": usage})

    return app


@contextlib.contextmanager
def serve(app):
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, 30)
        yield url
    finally:
        server.should_exit = True
        thread.join(10)


def quick_args(good: str, bad: str, out, *extra: str) -> list[str]:
    """``bench peers --quick`` (3 turns) against the two fake servers only, plus ``extra``."""
    base = ["peers", "--quick", "--servers", "none", "--url", f"good={good}", "--url", f"bad={bad}"]
    return [*base, "--out", str(out), "--quiet", "--max-turns", "3", *extra]


def test_peers_quick_against_fake_servers(tmp_path):
    from benchmarks import run

    with serve(fake_app(True)) as good, serve(fake_app(False)) as bad:
        rc = run.main(quick_args(good, bad, tmp_path, "--pairs", "good:bad"))
    assert rc == 0
    doc = json.loads((tmp_path / "peers_quick.json").read_text())
    assert (tmp_path / "peers_quick.md").is_file() and (tmp_path / "peers_quick.png").stat().st_size > 1000
    assert [s["name"] for s in doc["meta"]["servers"]] == ["good", "bad"]
    rep = {(r["peer"], r["workload"]): r for r in doc["summary"]["replays"]}
    assert set(rep) == {(p, w) for p in ("good", "bad") for w in ("agent", "restrict")}
    assert rep[("good", "agent")]["hit_rate"] > 0.5 and rep[("bad", "agent")]["hit_rate"] == 0
    # both servers got the same requests (turns 1..3 of the same sessions)
    assert rep[("good", "agent")]["requests"] == rep[("bad", "agent")]["requests"] == 3
    bf = {(b["label"], b["mode"]): b for b in doc["summary"]["bfcl"]}
    assert {m for _, m in bf} == {"auto", "required", "named", "subset"}
    for mode in ("auto", "required", "named", "subset"):
        assert bf[("good", mode)]["valid"] == 1.0 and bf[("good", mode)]["leak"] == 0
        assert bf[("bad", mode)]["leak"] == 1.0 and bf[("bad", mode)]["valid"] == 0
        assert bf[("bad", mode)]["ok"] == 0 and bf[("good", mode)]["n"] == 4  # 2 cases x 2 sets
    md = (tmp_path / "peers_quick.md").read_text()
    assert "## Fairness" in md and f"good={good}".split("=")[1] in md
    # --pairs good:bad: a before/after table of good's replays against bad's
    against = md.split("Against bad (same workload)")[1].split("##")[0]
    row = next(line for line in against.splitlines() if line.startswith("| good | agent |"))
    hit_gain = rep[("good", "agent")]["hit_rate"] - rep[("bad", "agent")]["hit_rate"]
    assert row.split("|")[3].strip() == f"{100 * hit_gain:+.1f}"
    # runs measured apart (e.g. one server per process) merge into one report
    assert (
        run.main(
            [
                "peers",
                "--merge",
                str(tmp_path / "peers_quick.json"),
                "--name",
                "merged",
                "--out",
                str(tmp_path),
                "--quiet",
            ]
        )
        == 0
    )
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged["summary"] == doc["summary"] and (tmp_path / "merged.png").is_file()


def test_peers_alternate_sends_each_turn_to_every_server_in_rotating_order(tmp_path):
    from benchmarks import run

    arrivals: list = []
    with serve(fake_app(True, arrivals)) as good, serve(fake_app(False, arrivals)) as bad:
        extra = ("--alternate", "--alternate-pause", "0", "--bfcl-modes", "")
        rc = run.main(quick_args(good, bad, tmp_path, *extra))
    assert rc == 0
    replayed = [a for a in arrivals if "|agent" in a[1] or "|restrict" in a[1]]
    assert len(replayed) == 12  # 2 workloads x 3 turns x 2 servers
    firsts = []
    for i in range(0, len(replayed), 2):
        (s1, k1, m1), (s2, k2, m2) = replayed[i], replayed[i + 1]
        assert {s1, s2} == {"good", "bad"}  # each turn to both servers before the next turn
        assert k1.split("|")[1] == k2.split("|")[1] and m1 == m2  # the same workload, session and turn
        firsts.append(s1)
    assert firsts == ["good", "bad", "good"] * 2  # the order rotates turn by turn, per workload
    doc = json.loads((tmp_path / "peers_quick.json").read_text())
    recs = [r for r in doc["records"]["replays"] if r["peer"] == "good" and r["workload"] == "agent"]
    row = next(r for r in doc["summary"]["replays"] if r["peer"] == "good" and r["workload"] == "agent")
    assert row["wall_s"] == pytest.approx(sum(r["total_s"] for r in recs), abs=1e-3)  # records rounded
    assert row["hit_rate"] > 0.5 and "alternated" in (tmp_path / "peers_quick.md").read_text()
