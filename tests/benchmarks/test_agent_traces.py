"""tests/fixtures/agent_traces.json is what the benchmarks' generators give (regenerate it with
tests/fixtures/make_agent_traces.py when they change), in the request layout the benchmarks send."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.harness.trace_gen import generate_sessions
from benchmarks.harness.variants import build_requests
from tests.cache_diag.helpers import trace_bodies
from tests.fixtures.make_agent_traces import build

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "agent_traces.json"


def test_the_fixture_equals_the_generators_output():
    assert json.loads(FIXTURE.read_text()) == json.loads(json.dumps(build()))


def test_the_fixture_bodies_are_the_good_variants_requests():
    (bodies,) = trace_bodies("vllm")
    session = generate_sessions(23, 1, context=8192, steps=16)[0]
    assert bodies == [r.body for r in build_requests(session, "good")]
