"""The tool-name token trie: which tokens keep the output inside ``lead + NAME + '"'``.

Built once per (vocabulary, tool names, envelope strings) and cached (LRU). It is a
byte trie over ``lead + name + term`` for every name, where ``lead`` is the forced
text before a name (Hermes: ``'\\n<tool_call>\\n{"name": "'``, the call separator plus
call_start plus name_open; a prefill or the text phase enters it part-way) and
``term`` is the first byte of name_close (``"``). For every node it stores the
vocabulary tokens that keep the text inside the trie, each transition tagged with
the set of names it can still reach (an int bitset over the name indices):

* a token that ends inside ``lead + name + term`` moves to that node; its name set is
  every name with that prefix;
* a token that reaches the end of ``name + term`` completes that one name; bytes past
  the terminator (``",`` → ``,``) must be a prefix of the rest of name_close
  (``', "arguments": '``) and are handed to the arguments phase as *overflow*. A token
  that would run past the end of name_close is left out (the arguments grammar owns
  that text): conservative, never unsound.

Names that are prefixes of other names (``shell_exec``, ``shell_exec_async``) work
because the terminator is part of the trie. Names follow ``name_char_ok`` (no ``"``, ``\\``,
whitespace or control characters).

A name may instead end with a *special token* (``term_token``: Mistral's ``[ARGS]``):
then ``term`` and ``close_rest`` are empty, no token crosses the end of a name, and the
node after a whole name (which may go on to longer names) has one more transition, the
special token, that completes it.

Build: for each name and each position, only the tokens that are prefixes of the text
still to come are looked up (``vocab.prefixes_of``: a dict probe per length, stopping
at the first length no token starts with), so the cost is O(total name bytes × token
length), independent of the vocabulary size; lead positions from which no token can
reach the name are done once, not once per name. The mask for an allowed subset at a node
is the union of the transitions whose name set meets the subset, packed once and
cached per (node, subset): a per-step lookup is one dict probe.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from server.constrain.row_cache import ROWS, owner_token
from server.constrain.vocab import TokenVocab


def name_char_ok(c: str) -> bool:
    """The per-character rule for a tool name (its one definition: the API's 400 and the trie).

    No quote or backslash (a name is written inside a JSON string without escapes), no
    whitespace or control character (the envelopes' tags are delimited by them).
    """
    return c not in '"\\' and not c.isspace() and ord(c) >= 32


class Step(NamedTuple):
    """One transition. ``node`` = next node, or -1 when the name is complete."""

    node: int
    names: int  # bitset of the names this transition can still reach
    name: int  # index of the completed name, or -1
    overflow: bytes  # bytes after the terminator (a prefix of close_rest); b"" if none


class NameTrie:
    def __init__(
        self,
        vocab: TokenVocab,
        names: tuple[str, ...],
        lead: bytes,
        term: bytes,
        close_rest: bytes,
        term_token: int | None = None,
    ) -> None:
        if not names:
            raise ValueError("a name trie needs at least one name")
        if term_token is not None and (term or close_rest):
            raise ValueError("a name ended by a special token has no terminator bytes")
        for name in names:
            if not name or not all(map(name_char_ok, name)) or (term and term.decode() in name):
                bad = f" or {term.decode()!r}" if term else ""
                raise ValueError(
                    f"tool name {name!r} cannot be masked: it is empty or contains a quote, backslash, "
                    f"whitespace or control character{bad}"
                )
        self.vocab, self.names, self.lead, self.term, self.close_rest = vocab, names, lead, term, close_rest
        self.term_token = term_token
        self.all_names = (1 << len(names)) - 1
        words = [lead + n.encode() + term for n in names]
        self._ids: dict[bytes, int] = {}
        self.children: list[dict[int, int]] = []
        self.node_names: list[int] = []
        self.leaf_name: list[int] = []
        for i, w in enumerate(words):
            prev = self._node(b"")
            self.node_names[prev] |= 1 << i
            for p in range(1, len(w) + 1):
                cur = self._node(w[:p])
                self.children[prev][w[p - 1]] = cur
                self.node_names[cur] |= 1 << i
                prev = cur
            self.leaf_name[prev] = i
        self.trans: list[dict[int, Step]] = [{} for _ in self.children]
        # lead positions from which no token reaches the name: the same for every name, done once
        shared = [
            not all(vocab.is_prefix(lead[p:end]) for end in range(p + 1, len(lead) + 1))
            for p in range(len(lead))
        ]
        by_token = term_token is not None  # the name ends with a special token ([ARGS]), not a byte
        for i, w in enumerate(words):
            ext, done = w + close_rest, 1 << i
            for p in range(len(w)):
                if i and p < len(lead) and shared[p]:
                    continue
                src = self.trans[self._ids[w[:p]]]
                for n, tid in vocab.prefixes_of(ext[p:]):
                    end = p + n
                    if end < len(w) or by_token:
                        dst = self._ids[w[:end]]
                        src[tid] = Step(dst, self.node_names[dst], -1, b"")
                    else:
                        src[tid] = Step(-1, done, i, ext[len(w) : end])
            if term_token is not None:
                self.trans[self._ids[w]][term_token] = Step(-1, done, i, b"")
        self._groups: list[dict[int, list[int]]] = []
        for tr in self.trans:
            groups: dict[int, list[int]] = {}
            for tid, step in tr.items():
                groups.setdefault(step.names, []).append(tid)
            self._groups.append(groups)
        self._token = owner_token()  # its rows' key in the shared byte-bounded cache

    def _node(self, prefix: bytes) -> int:
        nid = self._ids.get(prefix)
        if nid is None:
            nid = self._ids[prefix] = len(self.children)
            self.children.append({})
            self.node_names.append(0)
            self.leaf_name.append(-1)
        return nid

    # --- queries -----------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.children)

    @property
    def name_start(self) -> int:
        """The node right after the lead (where the name itself begins)."""
        return self._ids[self.lead]

    def node_of(self, text: bytes) -> int | None:
        """The node for ``text`` (a prefix of some ``lead + name + term``), else None."""
        return self._ids.get(text)

    def prefix_of(self, node: int) -> bytes:
        return next(k for k, v in self._ids.items() if v == node)

    def subset_bits(self, allowed: tuple[str, ...] | list[str]) -> int:
        index = {n: i for i, n in enumerate(self.names)}
        return sum(1 << index[n] for n in set(allowed))

    def step(self, node: int, token_id: int, subset: int) -> Step | None:
        """The transition for a token, or None when it leaves the trie or the allowed subset."""
        st = self.trans[node].get(token_id)
        return st if st is not None and st.names & subset else None

    def walk(self, node: int, data: bytes, subset: int) -> Step | None:
        """Feed raw bytes (a crossing token's overflow) from ``node``; None if they leave the trie."""
        i = 0
        if self.term_token is not None:  # no bytes complete a name: follow them, or leave the trie
            for b in data:
                node = self.children[node].get(b, -1)
                if node < 0:
                    return None
            return Step(node, self.node_names[node], -1, b"") if self.node_names[node] & subset else None
        while i < len(data) and self.leaf_name[node] < 0:
            nxt = self.children[node].get(data[i])
            if nxt is None:
                return None
            node, i = nxt, i + 1
        name = self.leaf_name[node]
        if name >= 0:
            rest = data[i:]
            ok = self.close_rest.startswith(rest) and (1 << name) & subset
            return Step(-1, 1 << name, name, rest) if ok else None
        return Step(node, self.node_names[node], -1, b"") if self.node_names[node] & subset else None

    def allowed_ids(self, node: int, subset: int) -> list[int]:
        return [tid for bits, ids in self._groups[node].items() if bits & subset for tid in ids]

    def mask_row(self, node: int, subset: int) -> np.ndarray:
        """Packed int32 row of the tokens allowed at ``node`` for the allowed names ``subset``."""
        return ROWS.get_or_make(
            (self._token, node, subset), lambda: self.vocab.pack(self.allowed_ids(node, subset))
        )


@lru_cache(maxsize=128)
def compile_trie(
    vocab: TokenVocab,
    names: tuple[str, ...],
    lead: bytes,
    term: bytes,
    close_rest: bytes,
    term_token: int | None = None,
) -> NameTrie:
    """The cached trie for a tool list (tool lists are stable per session, so this hits)."""
    return NameTrie(vocab, names, lead, term, close_rest, term_token)
