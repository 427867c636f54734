"""Request layouts: good is append-only; each bad variant differs where (and only where) it should."""

from __future__ import annotations

import json

import pytest

from benchmarks.harness.trace_gen import generate_session
from benchmarks.harness.variants import EDIT_EVERY, VARIANTS, build_requests


@pytest.fixture(scope="module")
def session():
    return generate_session(0, 0, context=131072, steps=30)


def _msgs(spec):
    return json.dumps(spec.body["messages"], sort_keys=True)


def test_good_is_append_only_with_fixed_tools(session):
    reqs = build_requests(session, "good")
    assert len(reqs) == len(session.turns)
    for a, b in zip(reqs, reqs[1:], strict=False):
        assert b.body["messages"][: len(a.body["messages"])] == a.body["messages"]
        assert b.body["tools"] == a.body["tools"] == session.tools
        assert "tool_choice" not in b.body


def test_unknown_variant_is_refused(session):
    with pytest.raises(ValueError, match="unknown variant"):
        build_requests(session, "nope")


def test_timestamp_changes_the_top_of_the_system_prompt_every_turn(session):
    reqs = build_requests(session, "timestamp")
    systems = [r.body["messages"][0]["content"] for r in reqs]
    assert len(set(systems)) == len(systems)
    assert all(s.startswith("Current time: 2026-") for s in systems)
    assert build_requests(session, "timestamp")[3].body == reqs[3].body  # deterministic


def test_shuffled_keys_change_the_strings_but_not_the_json(session):
    good = build_requests(session, "good")
    bad = build_requests(session, "shuffled_keys")
    changed = 0
    for g, b in zip(good, bad, strict=True):
        for mg, mb in zip(g.body["messages"], b.body["messages"], strict=True):
            if mg.get("tool_calls"):
                ag, ab = (
                    mg["tool_calls"][0]["function"]["arguments"],
                    mb["tool_calls"][0]["function"]["arguments"],
                )
                assert json.loads(ag) == json.loads(ab)
                changed += ag != ab
    assert changed > 10


def test_shuffled_keys_render_as_sent_on_this_server(session):
    """agentserve renders arguments in the client's key order (as the models' own templates
    do): the 'bad' variant is bad here too (the cache report names it)."""
    from server.families.render import renderer_for
    from server.protocol import ChatMessage

    hermes = renderer_for("hermes")
    g = build_requests(session, "good")[12].body
    b = build_requests(session, "shuffled_keys")[12].body
    assert _msgs(type("S", (), {"body": g})) != _msgs(type("S", (), {"body": b}))
    render = lambda body: hermes.render([ChatMessage(**m) for m in body["messages"]], body["tools"]).text  # noqa: E731
    assert render(g) != render(b)


def test_edited_observation_differs_from_the_edit_turn_on(session):
    good = build_requests(session, "good")
    bad = build_requests(session, "edited_observation")
    for g, b in zip(good, bad, strict=True):
        if g.turn < EDIT_EVERY:
            assert g.body == b.body
        else:
            assert _msgs(g) != _msgs(b)
            assert len(g.body["messages"]) == len(b.body["messages"])
    assert any("elided by the agent" in m["content"] for m in bad[-1].body["messages"] if m["role"] == "tool")


def test_tools_remove_sends_only_the_phase_tools_and_mask_keeps_all(session):
    remove = build_requests(session, "tools_remove")
    mask = build_requests(session, "tools_mask")
    good = build_requests(session, "good")
    phases = {t.index: t.phase for t in session.turns}
    assert len({json.dumps(r.body["tools"]) for r in remove}) > 1  # the list changes mid-session
    for r, m, g in zip(remove, mask, good, strict=True):
        names = [t["function"]["name"] for t in r.body["tools"]]
        assert names and all(n.startswith(phases[r.turn]) for n in names)
        assert m.body["tools"] == g.body["tools"] and m.body["messages"] == g.body["messages"]
        choice = m.body["tool_choice"]
        assert choice["type"] == "allowed_tools"
        assert choice["allowed_tools"]["tools"][0]["function"]["name_prefix"] == phases[m.turn]


def test_tools_keep_is_good(session):
    assert [r.body for r in build_requests(session, "tools_keep")] == [
        r.body for r in build_requests(session, "good")
    ]


def test_every_listed_variant_builds_one_request_per_turn_deterministically(session):
    # what `bench variants` iterates: each name must build, the same bodies on every run
    for variant in VARIANTS:
        reqs = build_requests(session, variant)
        assert [r.turn for r in reqs] == [t.index for t in session.turns], variant
        assert [r.body for r in reqs] == [r.body for r in build_requests(session, variant)], variant
