"""Watch free text for the call tag (``<tool_call>``): a KMP automaton run over token bytes.

In the text phase a reply may be plain text; a tool call begins when the text
completes the call tag. ``<tool_call>`` is not one token (SmolLM2: ``<``, ``tool``,
``_``, ``call``, ``>``), and a single token may finish it and run on (``>\\n``), so the
watch is a byte-level KMP automaton whose state is the length of the tag prefix
matched so far, and every token's effect on every state is precomputed once per
vocabulary:

* ``next[q][tid]`` — the new state, stored only when it is not 0 (most tokens reset);
* ``complete[q][tid]`` — the offset in the token's bytes just after the tag, for the
  tokens that complete it (the rest of the token is the *overflow*, fed to the call).

Only tokens that can move the automaton need simulating: those whose first byte is
live from state q, or that contain the tag's first byte anywhere; every other token
sends every state to 0 without completing the tag. Opaque tokens (special, padding)
reset the state (they print no text that could be part of a tag).
"""

from __future__ import annotations

from server.constrain.vocab import TokenVocab


class TagWatch:
    def __init__(self, vocab: TokenVocab, tag: bytes) -> None:
        if not tag:
            raise ValueError("the call tag to watch for is empty")
        self.tag = tag
        m = len(tag)
        fail = [0] * (m + 1)  # KMP failure function
        k = 0
        for i in range(1, m):
            while k and tag[i] != tag[k]:
                k = fail[k]
            if tag[i] == tag[k]:
                k += 1
            fail[i + 1] = k
        self.delta = [[0] * 256 for _ in range(m)]
        for q in range(m):
            for b in range(256):
                s = q
                while s and tag[s] != b:
                    s = fail[s]
                self.delta[q][b] = s + 1 if tag[s] == b else 0
        starters = [bytes([b]) for b in range(256) if self.delta[0][b]]
        restart = [tid for tid, tb in enumerate(vocab.token_bytes) if tb and any(s in tb for s in starters)]
        self.next: list[dict[int, int]] = []
        self.complete: list[dict[int, int]] = []
        for q in range(m):
            cands = set(restart)
            for b in range(256):
                if self.delta[q][b]:
                    cands.update(vocab.by_first_byte.get(b, ()))
            nxt: dict[int, int] = {}
            done: dict[int, int] = {}
            for tid in cands:
                s = q
                for j, b in enumerate(vocab.token_bytes[tid]):
                    s = self.delta[s][b]
                    if s == m:
                        done[tid] = j + 1
                        break
                else:
                    if s:
                        nxt[tid] = s
            self.next.append(nxt)
            self.complete.append(done)

    def step(self, q: int, token_id: int) -> tuple[int, int]:
        """(next state, -1) or (-1, offset just after the tag) when the token completes it."""
        off = self.complete[q].get(token_id)
        if off is not None:
            return -1, off
        return self.next[q].get(token_id, 0), -1
