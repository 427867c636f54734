"""A miss inside the previous reply names who changed it, in all three dialects (docs/cache.md):
``reply_changed`` when the client sent back other content than the server returned (where it first
differs), and no miss at all when the reply comes back as it was returned. (``reply_cut`` has no
e2e test: a reply that is only a call cut by max_tokens comes back as an empty assistant turn,
which no dialect renders back (hermes leaves it out), so none of it counts as reusable; the
server's cut is recorded by ``returned_reply``, tests/cache_diag/test_replies.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.three_dialects import DIALECTS, post

pytestmark = pytest.mark.e2e

SYSTEM = "You are a storyteller. " + " ".join(f"Rule {i}: be vivid." for i in range(20))
STORY = "Write a long story about a dragon who guards a library."


def ask(tag: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"[{tag}] {STORY}"}]


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.__name__)
def test_a_reply_sent_back_as_returned_misses_nothing_and_an_edited_one_is_reply_changed(server_url, dialect):
    key = f"reply-changed-{dialect.__name__}"
    system = f"[{key}] {SYSTEM}"
    first = ask(key)
    more = {"role": "user", "content": "Go on."}
    r1 = post(server_url, dialect.path, dialect.body(system, first, None, 40), key)
    text = dialect.text(r1)
    assert len(text) > 32 and not text.startswith("X"), r1  # long enough to span a cache block
    # the reply edited at its first character: the client changed it
    history = [*first, *dialect.replies(r1, "X" + text[1:]), more]
    r2 = post(server_url, dialect.path, dialect.body(system, history, None), key)
    c2 = r2["cache"]
    assert c2["type"] == "reply_changed", c2
    assert c2["detail"]["part"] == "content" and c2["detail"]["part_character"] == 0, c2
    assert c2["missed_tokens"] > 0 and "send the assistant's reply back exactly" in c2["fix"]
    # another session of the same turn, its reply sent back as returned: no alarm
    other = key + "-as-returned"
    r1 = post(server_url, dialect.path, dialect.body(system, first, None, 40), other)
    back = [*first, *dialect.replies(r1), more]
    same = post(server_url, dialect.path, dialect.body(system, back, None), other)
    assert same["cache"]["type"] is None, same["cache"]
