"""Each envelope's name trie against a brute-force scan of its family's whole real vocabulary.

Llama 3 (128,256 rows), Mistral tekken (131,072) and Qwen (151,936): for 44 tricky names and
several allowed subsets, the tokens allowed at every node of the name (and the last nodes of
the lead) are exactly those found by scanning every token's bytes, which are decoded here
independently of ``TokenVocab`` (GPT-2's byte alphabet, inverted). Names ended by a special
token (Mistral v13's ``[ARGS]``) are checked the same way: the special token is allowed
exactly where a whole allowed name has been written.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from server.constrain.vocab import TokenVocab

from .conftest import FAMILIES, TRICKY_NAMES
from .test_trie_vocab import BruteForce


class Scan(BruteForce):
    def allowed_for(
        self, text: bytes, words: list[bytes], close_rest: bytes, term_token: int | None
    ) -> set[int]:
        out: set[int] = set()
        for w in words:
            full = w if term_token is not None else w + close_rest
            if (
                not full.startswith(text)
                or len(text) > len(w)
                or (term_token is None and len(text) == len(w))
            ):
                continue
            if term_token is not None and text == w:
                out.add(term_token)
                continue
            rest = np.frombuffer(full[len(text) :], dtype=np.uint8)
            n = min(len(rest), self.mat.shape[1])
            ids = self.rows[rest[0]]
            ids = ids[self.lens[ids] <= n]
            eq = np.logical_and.accumulate(self.mat[ids, :n] == rest[:n], axis=1)
            out.update(ids[eq[np.arange(len(ids)), self.lens[ids] - 1]].tolist())
        return out


_SCANS: dict[str, Scan] = {}


def scan_for(off) -> Scan:
    if off.name not in _SCANS:
        _SCANS[off.name] = Scan(off.tokenizer, len(off.tokenizer))
    return _SCANS[off.name]


@pytest.mark.slow
@pytest.mark.parametrize("envelope", list(FAMILIES))
def test_trie_matches_a_scan_of_the_whole_vocabulary(official, envelope):
    if FAMILIES[envelope][0] == "mistral_spm":
        pytest.skip("the scan decodes byte-level BPE pieces; SentencePiece's are not")
    off = official(FAMILIES[envelope][0])
    scan = scan_for(off)
    assert off.vocab.token_bytes[: len(scan.tokens)] == scan.tokens  # two independent decodings agree
    masks = off.compiler(envelope).masks
    names = TRICKY_NAMES
    tries = [masks.next_trie(names)] + ([] if masks.shared_trie else [masks.first_trie(names)])
    rng = random.Random(len(envelope))
    subsets = [list(names), [n for n in names if n.startswith("s")], rng.sample(names, 5), [names[3]]]
    subsets.append([n for n in names if "open" in n])
    checked = 0
    for trie in tries:
        lead, close = trie.lead, trie.close_rest
        words = {n: lead + n.encode() + trie.term for n in names}
        for subset in subsets:
            bits = trie.subset_bits(subset)
            texts = {lead[:k] for k in range(max(0, len(lead) - 3), len(lead))}
            end = 1 if trie.term_token is not None else 0  # with a token end, the whole name is a node too
            texts |= {words[n][:k] for n in subset for k in range(len(lead), len(words[n]) + end)}
            for text in sorted(texts):
                node = trie.node_of(text)
                expected = scan.allowed_for(text, [words[n] for n in subset], close, trie.term_token)
                got = set(trie.allowed_ids(node, bits))
                assert got == expected, (envelope, text, subset, sorted(got ^ expected)[:5])
                assert TokenVocab.unpack(trie.mask_row(node, bits), off.vocab.vocab_size) == got
                checked += 1
    assert checked > 300


@pytest.mark.parametrize("envelope", list(FAMILIES))
def test_special_tokens_of_the_envelope_are_single_tokens(official, envelope):
    off = official(FAMILIES[envelope][0])
    masks = off.compiler(envelope).masks
    for token, tid in masks.special_ids.items():
        assert off.tokenizer.encode(token, add_special_tokens=False) == [tid]
        assert off.vocab.token_bytes[tid] == b""  # opaque: never part of text, names or arguments
    if masks.term_token is not None:
        trie = masks.next_trie(("a", "ab"))
        every = trie.all_names
        assert trie.step(trie.node_of(b"a"), masks.term_token, every).name == 0
        assert trie.step(trie.node_of(b"ab"), masks.term_token, every).name == 1
        assert trie.step(trie.node_of(b""), masks.term_token, every) is None  # no empty name
