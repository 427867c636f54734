"""The per-request tool constraint (``server.constrain.interface.TokenMatcher``): its phases.

Request lifecycle: the chat service calls ``plan_tools`` (mode, allowed names, prefill),
appends the prefill after the assistant header, and asks ``EnvelopeCompiler.build``
for a ``ToolMatcher`` that starts right after the prefill. Per decode step the
engine calls ``fill_next_token_bitmask`` then ``accept_token`` with the sampled id.

Phases (Hermes strings in brackets; what differs per envelope is precomputed in
``EnvelopeMasks``):

* TEXT (modes auto/none, empty prefill): free text; end of sequence allowed; special
  tokens other than EOS are not. How a call begins depends on the envelope's trigger:
  a text tag (``<tool_call>``, watched by a KMP automaton ``TagWatch``: in mode none
  every token that would complete it is masked; in auto, completing it enters CALL,
  and a token that completes it and runs on (``>\\n``) is allowed only if its overflow
  is a valid start of the call); a special token (``[TOOL_CALLS]``, allowed only when a
  call may start); or the start of the reply (Llama 3: the first token either enters
  the trie or diverges from the opening for good).
* CALL: the name trie (``NameTrie``) over ``lead + NAME + '"'`` restricted to the
  allowed names. It also covers the forced literal before the name (``\\n{"name": "``
  after the tag in the text, or the whole opening of a parallel call), so a prefill can
  end anywhere in it. A token that finishes the name and runs on (``",``) hands its
  overflow to ARGS; a name may also end with a special token (``[ARGS]``).
* ARGS: the arguments backend (xgrammar by default): rest of name_close, the tool's
  arguments (JSON schema, or Qwen3-Coder's XML parameters), call_end (with a model-written
  call id where the envelope has one). Special tokens are masked out of its rows.
* AFTER: end of sequence, or (``parallel``) another call: its separator, or its special
  token. Without parallel calls only EOS may follow, so ``is_terminated()`` is already
  True. With a token budget (``max_tokens``), another call may start only while the
  budget left holds the shortest complete call of an allowed tool (``min_call``): a call
  that cannot finish is never begun. An envelope with ``calls_close`` (Mistral v3's ``]``)
  has each call's grammar end with the close (then DONE) or the separator (then CALL, in
  the next call's lead). A sectioned envelope (Kimi K2, DeepSeek V3.1): the call start token is
  forced after the trigger (``pending``), the call end after the arguments (``call_end.py``), then
  the next call's start or the section's close (``close_token``), and only then the end.
* DONE / ERROR: nothing may follow; the mask allows EOS only so a stray step is safe.

``accept_token`` never raises: a rejected token returns False, sets ``error`` (what
token, which phase, what was allowed) and puts the constraint into ERROR.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from server.constrain.arguments.seam import ArgumentsBackend, ArgumentsMatcher
from server.constrain.bitmask import RowWriter
from server.constrain.envelope_masks import EnvelopeMasks
from server.constrain.plan import ToolPlan
from server.constrain.trie import NameTrie, Step


class Phase(IntEnum):
    TEXT = 0
    CALL = 1
    ARGS = 2
    AFTER = 3
    DONE = 4
    ERROR = 5


class ToolMatcher:
    """One request's tool-call constraint; see the module docstring for the phases."""

    def __init__(
        self,
        masks: EnvelopeMasks,
        backend: ArgumentsBackend,
        plan: ToolPlan,
        tries: tuple[NameTrie, NameTrie] | None,
        subset: int,
        compiled: dict[int, Any],
        eos: tuple[int, ...],
    ) -> None:
        self.masks, self.backend, self.plan, self.subset, self.compiled = (
            masks,
            backend,
            plan,
            subset,
            compiled,
        )
        self.first_trie: NameTrie | None = tries[0] if tries else None
        self.next_trie: NameTrie | None = tries[1] if tries else None
        self.trie = self.first_trie  # the trie of the call being written (names are the same in both)
        self.eos, self.eos_set = eos, frozenset(eos)
        self.error: str | None = None
        self.calls: list[str] = []  # names of the calls written so far
        self.budget: int | None = None  # tokens the reply may have (None: no limit); see more_calls
        self.min_call = 0  # tokens of the shortest complete further call of an allowed tool
        self.used = 0  # tokens accepted so far
        self.q, self.node, self.tool, self.tail = 0, 0, -1, b""
        self.pending: list[int] = []  # special tokens forced before the name (a section's call start)
        self.matcher: ArgumentsMatcher | None = None
        self.parallel = plan.parallel and masks.envelope.parallel
        self.at_start = (
            True  # nothing written yet (trigger "start", no call after text: calls begin only here)
        )
        self._rows = RowWriter()
        if plan.mode == "required" or plan.prefill:
            node = self._prefill_node(plan.prefill) if self.trie is not None else None
            if node is None:
                raise ValueError(f"prefill {plan.prefill!r} is not the start of a call to an allowed tool")
            self.phase, self.node, self.at_start = Phase.CALL, node, False
        else:
            self.phase = Phase.TEXT

    def _prefill_node(self, prefill: str) -> int | None:
        if self.masks.trigger == "token":
            m = self.masks
            want = [m.trigger_id, *m.open_tokens]
            for tid in want:  # the trigger, then a section's call start (Kimi, DeepSeek)
                tok, prefill = m.envelope.strip_special(prefill)
                if tok is None or m.special_ids.get(tok) != tid:
                    return None
        assert self.trie is not None
        return self.masks.first_node(self.trie, prefill.encode())

    # --- TokenMatcher -------------------------------------------------------------------------
    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        ph, m = self.phase, self.masks
        if self.pending:
            row = m.vocab.pack(self.pending[:1])
        elif ph == Phase.CALL:
            assert self.trie is not None  # CALL, ARGS and AFTER exist only with a trie
            row = self.trie.mask_row(self.node, self.subset)
        elif ph == Phase.TEXT:
            if self.at_start and m.trigger == "start":
                row = m.start_row(self.first_trie, self.subset, self.eos)
            else:
                row = m.text_row(self.q, self._call_trie(), self.subset, self.eos)
        elif ph == Phase.ARGS:
            assert self.matcher is not None
            self.matcher.fill(bitmask, index)  # opaque tokens are never in its rows
            return
        elif ph == Phase.AFTER:
            assert self.next_trie is not None
            row = m.after_row(self.next_trie, self.subset, self.eos, self.more_calls())
        else:
            row = m.eos_row(self.eos)
        self._rows.write(bitmask, index, row)

    def accept_token(self, token_id: int) -> bool:
        if self.phase == Phase.ERROR:
            return False
        try:
            ok = self._accept(int(token_id))
            self.used += ok
            return ok
        except Exception as exc:  # never raise inside the decode loop
            return self._reject(f"internal error in the tool constraint ({type(exc).__name__}: {exc})")

    def is_terminated(self) -> bool:
        ph = self.phase
        closes = self.masks.close_token is not None  # a section still to close (Kimi, DeepSeek)
        return ph >= Phase.DONE or (ph == Phase.AFTER and not self.more_calls() and not closes)

    def more_calls(self) -> bool:
        """May another (parallel) call start now? Not without budget to finish the shortest one."""
        if not self.parallel:
            return False
        return self.budget is None or self.budget - self.used >= self.min_call

    # --- internals -------------------------------------------------------------------------------
    def _what(self, tid: int) -> str:
        vocab = self.masks.vocab
        return vocab.describe(tid) if 0 <= tid < vocab.vocab_size else f"<out of range id {tid}>"

    def _reject(self, message: str) -> bool:
        self.error = message
        self.phase = Phase.ERROR
        return False

    def _no_call(self, tid: int) -> bool:
        return self._reject(
            f"token {self._what(tid)} would open a tool call ({self.masks.envelope.name} envelope), "
            f"but no tool may be called now (mode {self.plan.mode})"
        )

    def _accept(self, tid: int) -> bool:
        ph, vocab, m = self.phase, self.masks.vocab, self.masks
        text = vocab.token_bytes[tid] if 0 <= tid < vocab.vocab_size else b""
        if self.pending:
            if tid != self.pending[0]:
                return self._reject(
                    f"token {self._what(tid)} is not the forced {self._what(self.pending[0])}"
                )
            self.pending.pop(0)
            return True
        if ph == Phase.TEXT:
            if tid in self.eos_set:
                self.phase = Phase.DONE
                return True
            if m.trigger == "token" and tid == m.trigger_id:
                trie = self._call_trie()
                if trie is None:
                    return self._no_call(tid)
                self.phase, self.node = Phase.CALL, m.entry_node(trie)
                self.pending = list(m.open_tokens)
                return True
            if not text:
                return self._reject(f"special token {self._what(tid)} is not allowed in the text of a reply")
            if m.trigger == "start":  # a call can begin only with the first token of the reply
                return self._accept_start(tid) if self.at_start else True
            if m.trigger == "token":
                self.at_start = False
                return True
            assert m.watch is not None  # trigger "text"
            q, off = m.watch.step(self.q, tid)
            if off < 0:
                self.q = q
                return True
            if self.trie is None:
                return self._no_call(tid)
            start = m.tag_node(self.trie)
            st = self.trie.walk(start, text[off:], self.subset) if start is not None else None
            if st is None:
                return self._reject(
                    f"token {self._what(tid)} opens a tool call that cannot continue to an allowed tool"
                )
            return self._advance(st)
        trie, matcher = self.trie, self.matcher
        if ph == Phase.CALL:
            assert trie is not None  # CALL and ARGS exist only with a trie
            st = trie.step(self.node, tid, self.subset)
            if st is None:
                where = "name" if self.node >= trie.name_start else "opening"
                return self._reject(
                    f"token {self._what(tid)} is not allowed in the {where} phase of a tool call "
                    f"(allowed tools: {', '.join(self.plan.allowed)})"
                )
            return self._advance(st)
        if ph == Phase.ARGS:
            assert trie is not None and matcher is not None
            special_ok = getattr(matcher, "takes_special", False)  # Mistral v11's [ARGS] after the id
            if (not text and not special_ok) or not matcher.accept_token(tid):
                name = trie.names[self.tool]
                return self._reject(
                    f"token {self._what(tid)} is not allowed in the arguments of {name!r} "
                    f"(they follow its JSON schema)"
                )
            if m.calls_close:
                self.tail = (self.tail + text)[-len(m.calls_close) :]
            if matcher.is_terminated():
                self.calls.append(trie.names[self.tool])
                self.phase, self.matcher = Phase.AFTER, None
                if m.calls_close:  # the grammar wrote the close (done) or the separator (next call)
                    if self.tail == m.calls_close:
                        self.phase = Phase.DONE
                    else:
                        assert self.next_trie is not None
                        node = self.next_trie.node_of(self.masks.envelope.call_separator[:1].encode())
                        if node is None:
                            return self._reject("the call separator is not in the next call's trie")
                        self.trie, self.phase, self.node = self.next_trie, Phase.CALL, node
            return True
        if ph == Phase.AFTER:
            return self._accept_after(tid)
        return self._reject(f"token {self._what(tid)} came after the end of the reply")

    def _call_trie(self) -> NameTrie | None:
        """The first call's trie if a call may begin here, else None."""
        if self.masks.trigger == "token" and not self.masks.envelope.call_after_text and not self.at_start:
            return None
        return self.first_trie

    def _accept_start(self, tid: int) -> bool:
        """The first token of a reply whose calls have no marker (trigger ``start``)."""
        self.at_start = False
        if self.trie is not None:
            st = self.trie.step(self.masks.entry_node(self.trie), tid, self.subset)
            if st is not None:
                return self._advance(st)
        if tid in self.masks.start_clash_set:
            if self.trie is None:
                return self._no_call(tid)
            return self._reject(
                f"token {self._what(tid)} opens a tool call that cannot continue to an allowed tool"
            )
        return True

    def _accept_after(self, tid: int) -> bool:
        m = self.masks
        if m.close_token is not None and tid == m.close_token:  # the section's close: the reply ends
            self.phase = Phase.DONE
            return True
        if tid in self.eos_set and m.close_token is None:
            self.phase = Phase.DONE
            return True
        if self.more_calls() and self.next_trie is not None:
            if m.next_token is not None:
                if tid == m.next_token:
                    self.trie = self.next_trie
                    self.phase, self.node = Phase.CALL, 0
                    return True
            else:
                st = self.next_trie.step(0, tid, self.subset)
                if st is not None:
                    self.trie = self.next_trie
                    return self._advance(st)
        more = " or another tool call" if self.more_calls() else ""
        return self._reject(
            f"token {self._what(tid)} is not allowed after a tool call: only end of sequence{more}"
        )

    def _advance(self, st: Step) -> bool:
        if st.node >= 0:
            self.phase, self.node = Phase.CALL, st.node
            return True
        self.tool = st.name
        compiled = self.compiled[st.name]
        custom = getattr(compiled, "matcher", None)  # a custom tool's grammar (custom/)
        self.matcher = matcher = custom() if custom is not None else self.backend.matcher(compiled)
        self.phase = Phase.ARGS
        if self.masks.envelope.call_id_counts and hasattr(matcher, "expect"):  # Kimi: functions.N:IDX
            matcher.expect(str(self.plan.first_call_index + len(self.calls)))
        if st.overflow and not matcher.accept_bytes(st.overflow):
            return self._reject(f"the arguments grammar rejected {st.overflow!r} after the name")
        return True
