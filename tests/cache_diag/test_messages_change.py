"""messages_change (which message was edited, removed or inserted) is linear in the message count
and answers exactly what the quadratic slice search answered."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from server.cache_diag.changes import messages_change


def reference(p: tuple, c: tuple) -> dict[str, Any] | None:
    """The former quadratic search, without the system-message offset."""
    k = next((i for i in range(min(len(p), len(c))) if p[i] != c[i]), None)
    if k is None:
        if len(c) >= len(p):
            return None
        return {"message": len(c), "change": "removed", "count": len(p) - len(c), "role": p[len(c)][0]}
    edited = {"message": k, "change": "edited", "role": c[k][0], "role_before": p[k][0]}
    m = min(len(p) - k - 1, len(c) - k - 1)
    if m >= 1 and p[k + 1 : k + 1 + m] == c[k + 1 : k + 1 + m]:
        return edited
    for r in range(1, len(p) - k + 1):
        m = min(len(p) - k - r, len(c) - k)
        if m >= 1 and p[k + r : k + r + m] == c[k : k + m]:
            return {"message": k, "change": "removed", "count": r, "role": p[k][0]}
    for r in range(1, len(c) - k + 1):
        m = min(len(c) - k - r, len(p) - k)
        if m >= 1 and c[k + r : k + r + m] == p[k : k + m]:
            return {"message": k, "change": "inserted", "count": r, "role": c[k][0]}
    return edited


def fp(msgs: tuple) -> Any:
    return SimpleNamespace(messages=msgs)


MSG = st.tuples(st.sampled_from(["user", "assistant", "tool"]), st.sampled_from([b"a", b"b", b"c", b"d"]))


@settings(max_examples=400, deadline=None)
@given(st.lists(MSG, max_size=12), st.lists(MSG, max_size=12))
def test_answers_what_the_quadratic_search_answered(p, c):
    p, c = (("user", b"first"), *p), (("user", b"first"), *c)  # no system message: offsets are 0
    assert messages_change(fp(p), fp(c)) == reference(p, c)


def test_edits_removals_and_insertions_deep_in_a_long_session():
    p = tuple(("user", f"m{i}".encode()) for i in range(4000))
    assert messages_change(fp(p), fp(p[:10] + p[13:])) == {
        "message": 10,
        "change": "removed",
        "count": 3,
        "role": "user",
    }
    c = p[:3000] + (("tool", b"x"), ("tool", b"y")) + p[3000:]
    assert messages_change(fp(p), fp(c)) == {
        "message": 3000,
        "change": "inserted",
        "count": 2,
        "role": "tool",
    }
    assert messages_change(fp(p), fp(p + (("user", b"more"),))) is None
