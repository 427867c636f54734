"""One rule for the characters of a tool name: the API's 400 and the trie refuse the same names."""

from __future__ import annotations

import pytest

from server.chat.tool_choice import tool_names
from server.constrain.errors import ConstraintError
from server.constrain.trie import NameTrie
from server.constrain.vocab import TokenVocab

VOCAB = TokenVocab.from_strings([chr(c) for c in range(32, 127)] + ["\n", "\t", " ", "é"])


def _tool(name: str) -> dict[str, object]:
    return {"type": "function", "function": {"name": name}}


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("read_file", True),
        ("browser.click-2", True),
        ("café", True),
        ('a"b', False),
        ("a\\b", False),
        ("a b", False),
        ("a\tb", False),
        ("a\nb", False),
        ("a\x01b", False),
        ("a\u00a0b", False),  # no-break space is whitespace too
    ],
)
def test_api_and_trie_agree(name: str, ok: bool) -> None:
    api_ok = trie_ok = True
    try:
        tool_names([_tool(name)])
    except ConstraintError:
        api_ok = False
    try:
        NameTrie(VOCAB, (name,), b'{"name": "', b'"', b'", ')
    except ValueError:
        trie_ok = False
    assert (api_ok, trie_ok) == (ok, ok)
