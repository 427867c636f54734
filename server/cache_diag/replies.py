"""A reply as the server returned it and as the client sent it back: where they first differ.

A reply is compared in parts, each a label and its text: ``reasoning``, ``content``, and for each
call ``tool_calls[i].name`` / ``tool_calls[i].arguments`` (a custom tool's input as its
``{"input": …}`` arguments). Arguments that parse as JSON compare as JSON values with their key
order (a client that re-serializes them with other spacing sent back the same call); any other
text compares character by character. Built by ``server/chat/returned.py``.
"""

from __future__ import annotations

import json
from typing import Any

Parts = tuple[tuple[str, str], ...]


def _json(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=lambda pairs: ("object", pairs))
    except (json.JSONDecodeError, TypeError):
        return None


def _same(label: str, a: str, b: str) -> bool:
    if a == b:
        return True
    if not label.endswith(".arguments"):
        return False
    ja, jb = _json(a), _json(b)
    return ja is not None and ja == jb


def first_difference(returned: Parts, echoed: Parts) -> tuple[str, int] | None:
    """(the part, its first differing character in the text sent back) where ``echoed`` differs from
    ``returned``; None when the client sent the reply back as it was returned."""
    for i in range(max(len(returned), len(echoed))):
        if i >= len(echoed):
            return returned[i][0], 0  # a part returned was not sent back
        label, text = echoed[i]
        if i >= len(returned) or returned[i][0] != label:
            return label, 0  # a part sent back that was not returned (or in another place)
        before = returned[i][1]
        if _same(label, before, text):
            continue
        at = next((k for k, (x, y) in enumerate(zip(before, text, strict=False)) if x != y), None)
        return label, min(len(before), len(text)) if at is None else at
    return None
