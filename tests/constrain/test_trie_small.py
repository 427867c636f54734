"""The name trie on hand-made vocabularies: exact masks at every node."""

from __future__ import annotations

import pytest

from server.constrain.trie import NameTrie
from server.constrain.vocab import TokenVocab

TOKENS = [
    "<eos>",  # 0, special
    '"',  # 1
    '",',  # 2 crosses the end of a name
    '", "',  # 3 crosses further
    '"}',  # 4 crosses into text that is not name_close: never
    "open",  # 5
    'open"',  # 6 ends a name
    "o", "p", "e", "n",  # 7-10
    "_",  # 11
    "_a",  # 12
    "sync",  # 13
    "shell",  # 14
    "exec",  # 15
    "exec_async",  # 16
    "s", "h", "l", "x", "c",  # 17-21
    ", ",  # 22 never inside a name
    '"',  # 23 a duplicate of token 1 (some vocabularies have them)
    "ell_",  # 24
    '", "a": {',  # 25 runs past the end of name_close: left to the arguments phase
    'c"',  # 26
]  # fmt: skip
NAMES = ("open", "shell_exec", "shell_exec_async")


@pytest.fixture(scope="module")
def trie() -> NameTrie:
    vocab = TokenVocab.from_strings(TOKENS, special_ids=[0], vocab_size=40)  # padded logits width
    return NameTrie(vocab, NAMES, lead=b"", term=b'"', close_rest=b', "a": ')


def allowed(trie: NameTrie, prefix: str, names=NAMES) -> set[str]:
    node = trie.node_of(prefix.encode())
    assert node is not None, prefix
    ids = trie.allowed_ids(node, trie.subset_bits(names))
    assert TokenVocab.unpack(trie.mask_row(node, trie.subset_bits(names)), 40) == set(ids)
    return {f"{TOKENS[i]}#{i}" if TOKENS[i] == '"' else TOKENS[i] for i in ids}


def test_root(trie):
    assert allowed(trie, "") == {"open", 'open"', "o", "shell", "s"}
    assert allowed(trie, "", ["open"]) == {"open", 'open"', "o"}
    assert allowed(trie, "", ["shell_exec_async"]) == {"shell", "s"}


def test_inside_names(trie):
    assert allowed(trie, "o") == {"p"}
    assert allowed(trie, "s") == {"h"}
    assert allowed(trie, "sh") == {"e", "ell_"}
    assert allowed(trie, "she") == {"l"}
    assert allowed(trie, "shell") == {"_"}
    assert allowed(trie, "shell_") == {"exec", "exec_async", "e"}
    assert allowed(trie, "shell_", ["shell_exec"]) == {"exec", "e"}
    assert allowed(trie, "shell_exe") == {"c", 'c"'}
    assert allowed(trie, "shell_exe", ["shell_exec_async"]) == {"c"}


def test_end_of_name_and_crossing_tokens(trie):
    # '"' twice (duplicate ids), '",' and '", "' cross into name_close; '"}' and '", "a": {' never
    assert allowed(trie, "open") == {'"#1', '"#23', '",', '", "'}


def test_prefix_names(trie):
    assert allowed(trie, "shell_exec") == {'"#1', '"#23', '",', '", "', "_", "_a"}
    assert allowed(trie, "shell_exec", ["shell_exec"]) == {'"#1', '"#23', '",', '", "'}
    assert allowed(trie, "shell_exec", ["shell_exec_async"]) == {"_", "_a"}
    assert allowed(trie, "shell_exec_a") == {"sync", "s"}


def test_special_and_padding_never_allowed(trie):
    for node in range(trie.num_nodes):
        ids = set(trie.allowed_ids(node, trie.all_names))
        assert 0 not in ids and not ids & set(range(len(TOKENS), 40))


def test_steps_tag_names_and_overflow(trie):
    every = trie.all_names
    st = trie.step(trie.node_of(b"shell_exec"), 3, every)  # '", "'
    assert (st.node, trie.names[st.name], st.overflow) == (-1, "shell_exec", b', "')
    st = trie.step(trie.node_of(b"shell_exec"), 12, every)  # '_a'
    assert st.node == trie.node_of(b"shell_exec_a") and st.names == trie.subset_bits(["shell_exec_async"])
    st = trie.step(0, 6, every)  # 'open"' completes in one token
    assert (st.node, trie.names[st.name], st.overflow) == (-1, "open", b"")
    assert trie.step(0, 14, trie.subset_bits(["open"])) is None  # 'shell' outside the subset
    assert trie.step(0, 22, every) is None


def test_walk_bytes(trie):
    every = trie.all_names
    assert trie.walk(0, b'open", "a', every).overflow == b', "a'
    assert trie.walk(0, b"shell_ex", every).node == trie.node_of(b"shell_ex")
    assert trie.walk(0, b'open"}', every) is None
    assert trie.walk(0, b'open", "a": {', every) is None
    assert trie.walk(0, b"open", trie.subset_bits(["shell_exec"])) is None


def test_lead_is_part_of_the_trie():
    vocab = TokenVocab.from_strings(["\n", "<", "x", "\n<", '"', "y", '\n"', "<x", 'x"'])
    trie = NameTrie(vocab, ("x", "y"), lead=b"\n<", term=b'"', close_rest=b"")
    ids = {vocab.token_bytes[i] for i in trie.allowed_ids(0, trie.all_names)}
    assert ids == {b"\n", b"\n<"}
    ids = {vocab.token_bytes[i] for i in trie.allowed_ids(trie.node_of(b"\n"), trie.subset_bits(["x"]))}
    assert ids == {b"<", b"<x"}
    assert trie.name_start == trie.node_of(b"\n<")


def test_names_with_quotes_are_refused():
    vocab = TokenVocab.from_strings(["a"])
    with pytest.raises(ValueError, match="cannot be masked"):
        NameTrie(vocab, ('a"b',), b"", b'"', b"")
