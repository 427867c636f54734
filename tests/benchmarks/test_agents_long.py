"""The long-session arm's pure logic (benchmarks/agents/agents_long.py): which captured requests are
compactions, which request comes first after one, and the per-client summary over steady turns."""

from __future__ import annotations

import json

from benchmarks.agents.agents_long import annotate, compaction_kind, load_long, summarize
from benchmarks.compare.agents_long import markdown


def _claude(text: str) -> dict:
    body = {
        "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Say hi."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
            {"role": "user", "content": [{"type": "text", "text": text}]},
        ],
    }
    return {"method": "POST", "path": "/v1/messages", "query": "", "headers": {}, "body": body, "status": 200}


def _codex(text: str, path: str = "/v1/responses") -> dict:
    body = {
        "instructions": "x",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
        ],
    }
    return {"method": "POST", "path": path, "query": "", "headers": {}, "body": body, "status": 200}


CLAUDE_SUMMARY = (
    "Your task is to create a detailed summary of the conversation so far, paying close attention to "
    "the user's explicit requests"
)
CODEX_SUMMARY = "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary"


def test_a_compaction_request_is_told_from_its_last_user_message_or_its_path():
    assert compaction_kind(_claude(CLAUDE_SUMMARY)) == "summary prompt"
    assert compaction_kind(_codex(CODEX_SUMMARY)) == "summary prompt"
    assert compaction_kind(_codex("Say OK.", path="/v1/responses/compact")) == "responses/compact"
    assert compaction_kind(_claude("My notes, part 3: ... Say OK.")) is None
    assert compaction_kind(_codex("My notes, part 3: ... Say OK.")) is None
    # the words in an EARLIER message (a summary the session carries on with) do not make a compaction
    later = _claude("Say OK.")
    later["body"]["messages"][0]["content"][0]["text"] = CLAUDE_SUMMARY
    assert compaction_kind(later) is None
    assert compaction_kind({"method": "POST", "path": "/v1/messages", "body": None}) is None


def _row(turn: int, prompt: int, cached: int, prev: int | None, errors: list[str] | None = None) -> dict:
    row = {"turn": turn, "prompt": prompt, "cached": cached, "hit": cached / prompt, "errors": errors or []}
    if prev:
        row["of_previous"] = min(cached, prev) / prev
    return row


def test_annotate_marks_compactions_and_the_first_request_after_each():
    reqs = [_claude("a"), _claude("b"), _claude(CLAUDE_SUMMARY), _claude("c"), _claude("d")]
    rows = [_row(i + 1, 100, 0, None) for i in range(5)]
    out = annotate(rows, reqs)
    assert [r["compaction"] for r in out] == [None, None, "summary prompt", None, None]
    assert [r["after_compaction"] for r in out] == [False, False, False, True, False]


def test_summary_leaves_compactions_and_the_turn_after_out_of_the_steady_share():
    reqs = [_claude("a"), _claude("b"), _claude(CLAUDE_SUMMARY), _claude("c"), _claude("d"), _claude("e")]
    rows = [
        _row(1, 1000, 0, None),
        _row(2, 1200, 1000, 1000),  # steady: 100 %
        _row(3, 1300, 1200, 1200),  # compaction: excluded
        _row(4, 600, 400, 1300),  # after the compaction: excluded (30.8 %)
        _row(5, 800, 594, 600),  # steady: 99.0 %
        _row(6, 900, 700, 800, errors=["HTTP 400: too long"]),  # steady: 87.5 %, and a protocol error
    ]
    s = summarize(annotate(rows, reqs))
    assert s["requests"] == 6 and s["answered"] == 5 and s["protocol_errors"] == 1
    assert s["compactions"] == 1
    assert s["steady_of_previous"] == {"n": 3, "min": 0.875, "mean": round((1 + 0.99 + 0.875) / 3, 4)}
    assert s["steady_at_least_99"] == 2
    assert s["compaction_hit"]["n"] == 1 and s["compaction_hit"]["min"] == 1200 / 1300
    assert s["after_compaction_hit"] == {"n": 1, "min": 400 / 600, "mean": round(400 / 600, 4)}


def test_load_long_reads_only_the_long_captures_api_posts(tmp_path):
    rows = [
        {"method": "GET", "path": "/v1/codex/models", "body": None},
        _codex("a"),
        _codex("b", path="/v1/responses/compact"),
        {"method": "POST", "path": "/v1/messages/count_tokens", "body": {}},
    ]
    (tmp_path / "codex_long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "codex.jsonl").write_text(json.dumps(_codex("short")) + "\n")  # the short capture
    sessions = load_long(tmp_path)
    assert list(sessions) == ["codex"]
    assert [r["path"] for r in sessions["codex"]] == ["/v1/responses", "/v1/responses/compact"]


def test_markdown_names_each_kind_of_request_and_the_live_run():
    reqs = [_claude("a"), _claude(CLAUDE_SUMMARY), _claude("c")]
    rows = annotate([_row(1, 10, 0, None), _row(2, 12, 10, 10), _row(3, 5, 4, 12)], reqs)
    records = [{"client": "claude", "server": "agentserve", "ttft_ms": 1.0, **r} for r in rows]
    live = {
        "client": "claude",
        "turns": 30,
        "turns_completed": 29,
        "client_compactions": 2,
        "compaction_requests": 2,
        "requests": 32,
        "non_200": [[7, "/v1/messages", 400]],
    }
    meta = {
        "date": "d",
        "machine": "m",
        "commit": "c",
        "command": "x",
        "capture_args": "",
        "notes": [],
        "windows": "claude 32768",
        "servers": {"agentserve": "serve"},
        "live": [live],
    }
    text = markdown(records, [{"client": "claude", "server": "agentserve", **summarize(rows)}], meta)
    assert "| claude | 30 | 29 | 2 | 2 | 32 | 1 |" in text
    assert "| claude | 2 | agentserve | compaction (summary prompt) |" in text
    assert "| claude | 3 | agentserve | after compaction |" in text


def test_merge_joins_runs_of_one_client_each(tmp_path):
    from benchmarks.compare.agents_long import merge

    def body(client: str, window: int) -> dict:
        meta = {
            "windows": f"{client} {window}",
            "capture_args": f"--window {window}",
            "command": "c",
            "live": [{"client": client}],
            "date": "d",
        }
        rec = {"client": client, "server": "agentserve", "turn": 1}
        return {"meta": meta, "summaries": [{"client": client}], "records": [rec]}

    files = []
    for client, window in (("claude", 32768), ("codex", 65536), ("codex", 65536)):
        files.append(tmp_path / f"{client}.json")
        files[-1].write_text(json.dumps(body(client, window)))
    out = merge(files)
    assert [r["client"] for r in out["records"]] == ["claude", "codex", "codex"]
    assert [s["client"] for s in out["summaries"]] == ["claude", "codex", "codex"]
    assert out["meta"]["windows"] == "claude 32768; codex 65536" and out["meta"]["command"] == "c"
    assert [x["client"] for x in out["meta"]["live"]] == ["claude", "codex"]  # one live run a client


def test_a_client_retry_of_an_empty_reply_is_not_a_steady_turn():
    """Claude Code 2.1.332 resends a turn whose reply had no visible text, its last user message
    edited: the previous prompt cannot all come from cache, and the summary says so apart."""
    retry = _claude("Say OK.")
    retry["body"]["messages"][-1]["content"].append(
        {"type": "text", "text": "<system-reminder>\n[Your previous response had no visible output. Please"}
    )
    reqs = [_claude("a"), _claude("b"), retry, _claude("c")]
    rows = [
        _row(1, 1000, 0, None),
        _row(2, 1200, 1000, 1000),
        _row(3, 1250, 1000, 1200),
        _row(4, 1300, 1250, 1250),
    ]
    out = annotate(rows, reqs)
    assert [r["client_retry"] for r in out] == [False, False, True, False]
    s = summarize(out)
    assert s["steady_of_previous"]["n"] == 2 and s["steady_at_least_99"] == 2
    assert s["client_retry_of_previous"] == {"n": 1, "min": 1000 / 1200, "mean": round(1000 / 1200, 4)}
    assert compaction_kind(retry) is None


def test_reannotate_applies_the_current_rules_to_a_saved_run():
    from benchmarks.compare.agents_long import reannotate

    reqs = [_claude("a"), _claude(CLAUDE_SUMMARY), _claude("c")]
    rows = [_row(1, 10, 0, None), _row(2, 12, 10, 10), _row(3, 5, 4, 12)]
    saved = [
        {"client": "claude", "server": "vllm", "compaction": None, "after_compaction": False, **r}
        for r in rows
    ]
    body = {
        "meta": {},
        "records": saved,
        "summaries": [{"client": "claude", "server": "vllm", "compactions": 0}],
    }
    out = reannotate(body, {"claude": reqs})
    assert [r["compaction"] for r in out["records"]] == [None, "summary prompt", None]
    assert out["summaries"][0]["compactions"] == 1 and out["records"][2]["after_compaction"]
    assert reannotate(body, {}) == body  # no capture at hand: as saved


def test_without_custom_tools_leaves_out_only_the_grammar_tools():
    from benchmarks.compare.agents_long import without_custom_tools

    req = _codex("a")
    req["body"]["tools"] = [
        {"type": "function", "name": "exec_command", "parameters": {}},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark"}},
    ]
    (out,) = without_custom_tools([req])
    assert [t["name"] for t in out["body"]["tools"]] == ["exec_command"]
    assert len(req["body"]["tools"]) == 2  # the capture itself is unchanged


def test_replay_requests_computes_the_shares_and_keeps_a_dropped_request_as_a_row():
    import httpx

    from benchmarks.compare.agents import replay_requests

    answers = iter([{"prompt": 100, "cached": 0}, {"prompt": 200, "cached": 100}, None])

    def one(client, req, model):
        row = next(answers)
        if row is None:
            raise httpx.ReadError("dropped")
        return {"ttft_ms": 1.0, "calls": 0, "valid_calls": 0, "errors": [], **row}

    seen = []
    rows = replay_requests(None, [{}, {}, {}], "m", lambda req: one, seen.append)  # type: ignore[arg-type]
    assert [r.get("hit") for r in rows] == [0.0, 0.5, None]
    assert rows[1]["of_previous"] == 1.0 and "of_previous" not in rows[0]
    assert rows[2]["errors"] == ["ReadError('dropped')"] and seen == rows
