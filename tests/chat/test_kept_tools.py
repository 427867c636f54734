"""keep(): which tool lists the server renders instead of the one sent; ToolMemory's bounds."""

from __future__ import annotations

from typing import Any

from server.chat.kept_tools import ToolMemory, keep


def tool(name: str, desc: str = "") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": desc or name, "parameters": {}}}


A, B, C = tool("a"), tool("b"), tool("c")


def test_fewer_or_no_tools_keep_the_previous_list_and_mask_the_rest():
    kept = keep([A, B, C], [B])
    assert kept is not None and kept.rendered == [A, B, C] and kept.masked == ["a", "c"]
    kept = keep([A, B, C], [])
    assert kept is not None and kept.masked == ["a", "b", "c"]


def test_another_order_or_key_order_renders_the_earlier_form_with_every_tool_callable():
    kept = keep([A, B, C], [C, A, B])
    assert kept is not None and kept.rendered == [A, B, C] and kept.masked == []
    swapped = {"function": A["function"], "type": "function"}  # the keys in another order
    kept = keep([A, B], [swapped, B])
    assert kept is not None and list(kept.rendered[0]) == ["type", "function"]


def test_the_same_list_an_added_or_an_edited_tool_is_rendered_as_sent():
    assert keep([A, B], [A, B]) is None
    assert keep([A, B], [A, B, C]) is None  # added: a real change
    assert keep([A, B], [C]) is None  # replaced
    assert keep([A, B], [tool("a", "edited")]) is None  # a changed definition
    assert keep([], []) is None


def test_memory_is_bounded_by_sessions_and_bytes_and_shares_equal_lists():
    m = ToolMemory(sessions=2, max_bytes=10_000)
    m.put("t", "s1", [A, B])
    m.put("t", "s2", [A, B])
    one = m.bytes
    assert m.get("t", "s1") == [A, B] and m.get("other tenant", "s1") is None
    m.put("t", "s3", [C])  # over 2 sessions: the least recently used (s2) goes
    assert len(m) == 2 and m.get("t", "s2") is None and m.get("t", "s1") == [A, B]
    assert m.bytes > one
    small = ToolMemory(sessions=10, max_bytes=len(str(A)) * 2)
    small.put("t", "s1", [A, B, C])  # larger than the whole budget: not kept
    assert small.get("t", "s1") is None and small.bytes == 0
