"""The SWE-agent replayer: copied data, SWE-agent keys stripped, deterministic truncation, stop rule."""

from __future__ import annotations

import json

from benchmarks.harness.swe_traces import TRACE_DIR, TRACES, load_trace, truncate_observation
from benchmarks.harness.trace_gen import approx_tokens
from benchmarks.harness.variants import build_requests


def test_traces_and_licence_are_in_the_repo():
    assert (TRACE_DIR / "LICENSE").read_text().startswith("MIT License")
    for name in TRACES:
        assert (TRACE_DIR / name).is_file()


def test_messages_are_openai_shape_without_swe_agent_keys():
    s = load_trace(TRACES[0], context=10**6)
    assert len(s.messages) == 24 and len(s.turns) == 11
    for m in s.messages:
        assert set(m) <= {"role", "content", "tool_calls", "tool_call_id", "name"}
        if m["role"] == "tool":
            assert m["tool_call_id"].startswith("call_")
    names = {t["function"]["name"] for t in s.tools}
    assert {"bash", "submit", "open", "edit", "find_file"} <= names
    for t in s.tools:
        assert t["function"]["parameters"]["type"] == "object"
    used = {c["function"]["name"] for m in s.messages for c in m.get("tool_calls", [])}
    assert used <= names


def test_truncation_is_deterministic_and_bounded():
    text = "".join(f"line {i}\n" for i in range(2000))
    a = truncate_observation(text, 1000)
    assert a == truncate_observation(text, 1000)
    assert a.startswith("line 0\n") and a.endswith("line 1999\n") and "characters truncated" in a
    assert len(a) < 1100
    assert truncate_observation("short", 1000) == "short"
    s1 = load_trace(TRACES[1], max_obs_chars=1500, context=10**6)
    s2 = load_trace(TRACES[1], max_obs_chars=1500, context=10**6)
    assert json.dumps(s1.messages) == json.dumps(s2.messages)
    assert max(len(m["content"]) for m in s1.messages if m["role"] == "tool") < 1600


def test_stops_at_the_turn_that_no_longer_fits():
    def count(messages, tools):
        return sum(approx_tokens(json.dumps(m)) for m in messages) + 500

    s = load_trace(TRACES[0], context=3000, reserve=256, prompt_tokens=count)
    assert 0 < len(s.turns) < 11 and "stopped before turn" in s.notes
    assert all(count(s.messages[: t.end], s.tools) <= 3000 - 256 for t in s.turns)
    reqs = build_requests(s, "good")
    assert [r.turn for r in reqs] == [t.index for t in s.turns]


def test_fixture_tools_are_the_benchmark_converter_output():
    """One converter: the test fixtures are exactly what benchmarks.harness.swe_traces makes of the
    bundles."""
    import importlib.util
    import json
    from pathlib import Path

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    spec = importlib.util.spec_from_file_location(
        "make_swe_agent_tools", fixtures / "make_swe_agent_tools.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tools_dir = Path(__file__).resolve().parents[2] / "benchmarks" / "traces" / "swe-agent" / "tools"
    assert mod.build(tools_dir) == json.loads((fixtures / "swe_agent_tools.json").read_text())
    assert mod.build(tools_dir, prefixed=True) == json.loads(
        (fixtures / "prefixed_agent_tools.json").read_text()
    )
    names = [t["function"]["name"] for t in mod.build(tools_dir, prefixed=True)]
    assert names[0] == "shell_exec" and all(
        n.startswith(("file_", "browser_", "shell_", "submit")) for n in names
    )
