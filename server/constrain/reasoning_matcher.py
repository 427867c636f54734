"""Reasoning first, then the tool constraint: the per-request gate of a reasoning family.

A reasoning model (Qwen3: ``<think>\\n…\\n</think>\\n\\n`` then its answer) must be free to
think before the tool mode applies, so ``required`` and a named tool keep the thinking
instead of forcing the call envelope at the first token. The gate wraps the request's tool
constraint (or none, without tools) and runs these phases:

* OPEN: the reasoning's open text (``<think>\\n``) is forced, token by token;
* THINK: free text (no special token, no end of sequence: the reasoning must close); a
  ``<tool_call>`` written here is plain text, never a call. A byte-level KMP watch
  (``TagWatch``) looks for the close tag (``</think>``). A token that completes it may run on
  only with a prefix of what is forced next;
* FORCE: the rest after the close tag (``\\n\\n``) and the tool plan's prefill (``<tool_call>\\n
  {"name": "`` for required / named) are forced. When the reasoning budget is spent, FORCE
  writes the whole close text (``\\n</think>\\n\\n``, or the rest of a half-written tag) first;
* PICK (a family with ``answer_open``, Harmony, when no prefill is forced): the answer's header
  (``<|channel|>final<|message|>``) or, when a call may start, the envelope's opening
  (``<|channel|>commentary to=functions.``), each the tokenizer's encoding, token by token:
  the tokens both share, then the one the model's token follows. The header written whole: free
  text and end of sequence (a plain answer holds no call); the opening: fed to the tool
  constraint (its trigger, then its name trie), which goes on;
* INNER: the tool constraint from its prefill on (a ``ToolMatcher`` whose ``max_tokens``
  budget is reduced by the tokens already written), or free text and end of sequence.

Forced text is the tokenizer's encoding of the string (``</think>`` is one token in Qwen's
vocabulary); every forced row allows exactly one token. A close tag that is a single special
token (Mistral's ``[/THINK]``) is allowed in THINK by its id and ends the reasoning there.
``accept_token`` never raises.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import numpy as np

from server.constrain.bitmask import write_row
from server.constrain.interface import TokenMatcher
from server.constrain.tag_watch import TagWatch
from server.constrain.vocab import TokenVocab


class ReasoningPhase(IntEnum):
    OPEN = 0
    THINK = 1
    FORCE = 2
    PICK = 3
    INNER = 4
    DONE = 5
    ERROR = 6


class ReasoningMasks:
    """Per (vocabulary, open, close): the close-tag watch and the THINK rows, shared by requests."""

    def __init__(self, vocab: TokenVocab, tokenizer: Any, open_text: str, close_text: str) -> None:
        self.vocab, self.tokenizer = vocab, tokenizer
        self.open_text, self.close_text = open_text, close_text
        self.tag = close_text.strip()
        # a close that begins with a special token (Mistral's [/THINK], Harmony's <|end|>): no text
        # spells it, the id ends the reasoning and the rest of the close is forced after it
        ids = self.encode(self.tag)
        self.tag_id = ids[0] if ids and not vocab.token_bytes[ids[0]] else None
        if self.tag_id is not None and len(ids) > 1:
            self.tag = str(tokenizer.decode(ids[:1], skip_special_tokens=False))
        self.after_tag = close_text[close_text.index(self.tag) + len(self.tag) :]  # "\n\n"
        self.watch = TagWatch(vocab, self.tag.encode())
        self.answer_ids: dict[str, list[int]] = {}
        self._rows: dict[tuple[int, bytes], np.ndarray] = {}

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def think_row(self, q: int, forced_after: bytes) -> np.ndarray:
        """THINK at watch state q: text tokens; one completing the tag only if its overflow fits."""
        key = (q, forced_after)
        row = self._rows.get(key)
        if row is None:
            banned = [
                tid
                for tid, off in self.watch.complete[q].items()
                if not forced_after.startswith(self.vocab.token_bytes[tid][off:])
            ]
            allowed = self.vocab.text_ids
            if self.tag_id is not None:
                allowed = np.append(allowed, self.tag_id)
            row = self.vocab.pack(allowed) & ~self.vocab.pack(banned)
            if len(self._rows) < 256:
                self._rows[key] = row
        return row


class ReasoningMatcher:
    """One request's reasoning gate around its tool constraint (``inner``; None: free text)."""

    def __init__(
        self,
        masks: ReasoningMasks,
        inner: TokenMatcher | None,
        prefill: str,
        eos: tuple[int, ...],
        budget: int | None = None,
        open_forced: bool = True,
        answer_open: str = "",
        call_open: str = "",
        answer_inner: bool = False,
    ) -> None:
        self.masks, self.inner, self.eos, self.budget = masks, inner, eos, budget
        # after answer_open: True = ``inner`` constrains the answer's text (response_format's JSON),
        # False = free text (the tool constraint only applies to a call)
        self.answer_inner = answer_inner
        # Harmony: a plain answer begins with answer_open, a call with the envelope's opening: the
        # model picks one right after the close (PICK); none of this when a prefill is forced
        self.ways = (
            [masks.encode(t) for t in (answer_open, call_open) if t] if answer_open and not prefill else []
        )
        self.k = 0  # tokens written in PICK
        self.answer_way = self.ways[0] if self.ways else None
        self.error: str | None = None
        self.forced_after = (masks.after_tag + prefill).encode()  # what follows the close tag
        self.after_text = masks.after_tag + prefill
        self.q = 0
        self.thought = 0  # reasoning tokens written (the open text excluded)
        self.used = 0  # every token accepted
        self.forced: list[int] = []
        self.phase = ReasoningPhase.THINK
        self._then = ReasoningPhase.THINK
        if open_forced and masks.open_text:
            self._force(masks.encode(masks.open_text), then=ReasoningPhase.THINK)
        elif budget is not None and budget <= 0:
            self._force_close()

    # --- TokenMatcher ----------------------------------------------------------------------
    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        ph, vocab = self.phase, self.masks.vocab
        if ph == ReasoningPhase.INNER and self.inner is not None:
            self.inner.fill_next_token_bitmask(bitmask, index)
            return
        if ph == ReasoningPhase.PICK:
            self._fill_pick(bitmask, index)
            return
        if ph in (ReasoningPhase.OPEN, ReasoningPhase.FORCE):
            row = vocab.pack([self.forced[0]])
        elif ph == ReasoningPhase.THINK:
            row = self.masks.think_row(self.q, self.forced_after)
        elif ph == ReasoningPhase.INNER:
            row = vocab.pack(np.concatenate([vocab.text_ids, np.array(self.eos, dtype=np.int64)]))
        else:
            row = vocab.pack(self.eos)
        write_row(bitmask, index, row)

    def accept_token(self, token_id: int) -> bool:
        if self.phase == ReasoningPhase.ERROR:
            return False
        try:
            ok = self._accept(int(token_id))
        except Exception as exc:  # never raise inside the decode loop
            ok = self._reject(f"internal error in the reasoning gate ({type(exc).__name__}: {exc})")
        self.used += ok
        return ok

    def is_terminated(self) -> bool:
        if self.phase == ReasoningPhase.INNER and self.inner is not None:
            return self.inner.is_terminated()
        return self.phase >= ReasoningPhase.DONE

    # --- internals ------------------------------------------------------------------------------
    def _reject(self, message: str) -> bool:
        self.error, self.phase = message, ReasoningPhase.ERROR
        return False

    def _force(self, ids: list[int], then: ReasoningPhase) -> None:
        self._then = then
        if ids:
            self.forced, self.phase = (
                list(ids),
                (ReasoningPhase.OPEN if then == ReasoningPhase.THINK else ReasoningPhase.FORCE),
            )
        else:
            self._enter(then)

    def _enter(self, phase: ReasoningPhase) -> None:
        self.phase = phase
        if phase != ReasoningPhase.INNER:
            return
        self._start_inner()
        if self.ways and self.k == 0:  # the answer's header, or a call's opening
            self.phase = ReasoningPhase.PICK

    def _start_inner(self) -> None:
        if self.inner is not None:
            budget = getattr(self.inner, "budget", None)
            if budget is not None:  # the reply's max_tokens: what the reasoning wrote is spent
                self.inner.budget = max(0, budget - self.used - 1)  # type: ignore[attr-defined]

    def _force_close(self) -> None:
        """The budget is spent: the close text (or the rest of a half-written tag), then what follows."""
        masks = self.masks
        rest = masks.close_text if self.q == 0 else masks.tag[self.q :] + masks.after_tag
        self._force(masks.encode(rest + self.after_text[len(masks.after_tag) :]), then=ReasoningPhase.INNER)

    def _accept(self, tid: int) -> bool:
        ph, vocab = self.phase, self.masks.vocab
        if ph in (ReasoningPhase.OPEN, ReasoningPhase.FORCE):
            if tid != self.forced[0]:
                return self._reject(
                    f"token {vocab.describe(tid)} is not the forced {vocab.describe(self.forced[0])} "
                    f"({'opening' if ph == ReasoningPhase.OPEN else 'closing'} the reasoning)"
                )
            self.forced.pop(0)
            if not self.forced:
                self._enter(self._then)
                if self.phase == ReasoningPhase.THINK and self.budget is not None and self.budget <= 0:
                    self._force_close()
            return True
        if ph == ReasoningPhase.THINK:
            text = vocab.token_bytes[tid] if 0 <= tid < vocab.vocab_size else b""
            if tid == self.masks.tag_id:  # the special-token close tag
                self.q = 0
                self._force(self.masks.encode(self.after_text), then=ReasoningPhase.INNER)
                return True
            if not text:
                return self._reject(
                    f"token {vocab.describe(tid) if 0 <= tid < vocab.vocab_size else tid} is not text: "
                    f"the reasoning must close with {self.masks.tag!r} first"
                )
            self.thought += 1
            q, off = self.masks.watch.step(self.q, tid)
            if off >= 0:  # the close tag: force what follows it (less what this token already wrote)
                over = text[off:]
                if not self.forced_after.startswith(over):
                    return self._reject(f"token {vocab.describe(tid)} runs on past the close tag: {over!r}")
                rest = self.forced_after[len(over) :].decode()
                self.q = 0
                self._force(self.masks.encode(rest), then=ReasoningPhase.INNER)
                return True
            self.q = q
            if self.budget is not None and self.thought >= self.budget:
                self._force_close()
            return True
        if ph == ReasoningPhase.PICK:
            return self._accept_pick(tid)
        if ph == ReasoningPhase.INNER:
            if self.inner is not None:
                ok = self.inner.accept_token(tid)
                if not ok:
                    self.error = self.inner.error
                return ok
            if tid in self.eos:
                self.phase = ReasoningPhase.DONE
                return True
            if 0 <= tid < vocab.vocab_size and vocab.token_bytes[tid]:
                return True
            return self._reject(f"special token {tid} is not allowed in the text of a reply")
        return self._reject(f"token {tid} came after the end of the reply")

    # --- PICK: the answer's header (ways[0]) or a call's opening (ways[1]), token by token ----------
    def _fill_pick(self, bitmask: Any, index: int) -> None:
        nxt = sorted({w[self.k] for w in self.ways})
        write_row(bitmask, index, self.masks.vocab.pack(nxt))

    def _accept_pick(self, tid: int) -> bool:
        ways = [w for w in self.ways if w[self.k] == tid]
        if not ways:
            return self._reject(
                f"token {self.masks.vocab.describe(tid)} begins neither the answer nor a tool call"
            )
        self.ways, self.k = ways, self.k + 1
        done = next((w for w in ways if len(w) == self.k), None)
        if done is None:
            return True
        self.phase = ReasoningPhase.INNER
        if done is self.answer_way:  # a plain answer: free text (or response_format's), no call inside it
            if not self.answer_inner:
                self.inner = None
            return True
        assert self.inner is not None  # a call's way exists only with a tool constraint
        for t in done:  # the opening, into the tool constraint (its trigger, then its trie)
            if not self.inner.accept_token(t):
                self.error = self.inner.error
                return False
        return True
