"""The per-request tool constraint (``server.masking.interface.TokenConstraint``) and its factory.

Request lifecycle: the chat service calls ``plan_tools`` (mode, allowed names, prefill),
appends the prefill after the assistant header, and asks ``ConstraintFactory.build``
for a ``ToolConstraint`` that starts right after the prefill. Per decode step the
engine calls ``fill_next_token_bitmask`` then ``accept_token`` with the sampled id.

Phases (Hermes strings in brackets):

* TEXT (modes auto/none, empty prefill): free text; end of sequence allowed; special
  tokens other than EOS are not. A KMP watch (``TagWatch``) tracks ``<tool_call>``:
  in mode none (or auto with nothing allowed) every token that would complete it is
  masked; in auto, completing it enters CALL, and a token that completes it and runs
  on (``>\\n``) is allowed only if its overflow is a valid start of the call.
* CALL: the name trie (``NameTrie``) over ``sep + call_start + name_open + NAME + '"'``
  restricted to the allowed names. It also covers the forced literal before the name
  (``\\n{"name": "`` after the tag in the text, or the whole opening of a parallel call),
  so a prefill can end anywhere in it. A token that finishes the name and runs on
  (``",``) hands its overflow to ARGS.
* ARGS: the arguments backend (xgrammar by default): rest of name_close, the tool's
  JSON schema, call_end. Special tokens are masked out of its rows.
* AFTER: end of sequence, or (``parallel``) another call starting with the separator.
  Without parallel calls only EOS may follow, so ``is_terminated()`` is already True.
* DONE / ERROR: nothing may follow; the mask allows EOS only so a stray step is safe.

``accept_token`` never raises: a rejected token returns False, sets ``error`` (what
token, which phase, what was allowed) and puts the constraint into ERROR.
"""

from __future__ import annotations

import threading
from enum import IntEnum
from typing import Any

import numpy as np

from server.families.envelope import Envelope
from server.masking.arguments import make_backend, tool_schema
from server.masking.tag_watch import TagWatch
from server.masking.tool_choice import ToolPlan, tool_names
from server.masking.trie import NameTrie, compile_trie
from server.masking.vocab import TokenVocab

_ROW_CACHE_LIMIT = 4096


class Phase(IntEnum):
    TEXT = 0
    CALL = 1
    ARGS = 2
    AFTER = 3
    DONE = 4
    ERROR = 5


class ConstraintFactory:
    """Per (tokenizer, vocab_size, envelope): the preprocessed vocabulary, tag watch, caches."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        envelope: Envelope,
        backend: str = "xgrammar",
        *,
        any_whitespace: bool = False,
        vocab: TokenVocab | None = None,
    ) -> None:
        self.vocab = vocab or TokenVocab.from_tokenizer(tokenizer, vocab_size)
        self.envelope = envelope
        self.backend_name = backend
        tag = envelope.call_tag if envelope.call_start.startswith(envelope.call_tag) else envelope.call_start
        self.lead = (envelope.call_separator + envelope.call_start + envelope.name_open).encode()
        self.tag_prefix = (envelope.call_separator + tag).encode()  # trie node reached when the tag completes
        self.term = envelope.name_close[:1].encode()
        self.close_rest = envelope.name_close[1:]
        self.watch = TagWatch(self.vocab, tag.encode())
        self.backend = make_backend(backend, self.vocab, any_whitespace=any_whitespace)
        self._rows: dict[tuple, np.ndarray] = {}
        self._lock = threading.Lock()

    def trie(self, names: tuple[str, ...]) -> NameTrie:
        return compile_trie(self.vocab, names, self.lead, self.term, self.close_rest.encode())

    def build(self, tools: list[dict] | None, plan: ToolPlan, eos_token_ids: tuple[int, ...] | list[int]):
        """The constraint for one request, or None when no tools were given (nothing to enforce)."""
        names = tool_names(tools)
        if not names:
            return None
        eos = tuple(sorted(set(eos_token_ids)))
        trie, subset, compiled = None, 0, {}
        if plan.mode != "none" and plan.allowed:
            trie = self.trie(names)
            subset = trie.subset_bits(plan.allowed)
            by_name = {n: t for n, t in zip(names, tools or [], strict=True)}
            for name in plan.allowed:
                compiled[names.index(name)] = self.backend.compile(
                    name, tool_schema(by_name[name]), self.close_rest, self.envelope.call_end
                )
        return ToolConstraint(self, plan, trie, subset, compiled, eos)

    # --- cached rows -------------------------------------------------------------------------
    def _cached(self, key: tuple, make) -> np.ndarray:
        row = self._rows.get(key)
        if row is None:
            row = make()
            with self._lock:
                if len(self._rows) >= _ROW_CACHE_LIMIT:
                    self._rows.clear()
                self._rows[key] = row
        return row

    def eos_row(self, eos: tuple[int, ...]) -> np.ndarray:
        return self._cached(("eos", eos), lambda: self.vocab.pack(eos))

    def text_row(self, q: int, trie: NameTrie | None, subset: int, eos: tuple[int, ...]) -> np.ndarray:
        """Free text from watch state q; completing the tag only if the overflow starts a valid call."""

        def make() -> np.ndarray:
            row = self.vocab.pack(np.concatenate([self.vocab.text_ids, np.array(eos, dtype=np.int64)]))
            start = trie.node_of(self.tag_prefix) if trie is not None else None
            banned = [
                tid
                for tid, off in self.watch.complete[q].items()
                if start is None or trie.walk(start, self.vocab.token_bytes[tid][off:], subset) is None
            ]
            return row & ~self.vocab.pack(banned)

        return self._cached(("text", q, trie, subset, eos), make)

    def after_row(self, trie: NameTrie, subset: int, eos: tuple[int, ...], parallel: bool) -> np.ndarray:
        if not parallel:
            return self.eos_row(eos)
        return self._cached(
            ("after", trie, subset, eos), lambda: self.eos_row(eos) | trie.mask_row(0, subset)
        )


class ToolConstraint:
    """One request's tool-call constraint; see the module docstring for the phases."""

    def __init__(self, factory, plan: ToolPlan, trie, subset: int, compiled: dict, eos: tuple[int, ...]):
        self.f, self.plan, self.trie, self.subset, self.compiled = factory, plan, trie, subset, compiled
        self.eos, self.eos_set = eos, frozenset(eos)
        self.error: str | None = None
        self.calls: list[str] = []  # names of the calls written so far
        self.q, self.node, self.tool, self.matcher = 0, 0, -1, None
        self._bm: Any = None
        self._arr: Any = None
        if plan.mode == "required" or plan.prefill:
            node = (
                trie.node_of(factory.envelope.call_separator.encode() + plan.prefill.encode())
                if trie
                else None
            )
            if node is None:
                raise ValueError(f"prefill {plan.prefill!r} is not the start of a call to an allowed tool")
            self.phase, self.node = Phase.CALL, node
        else:
            self.phase = Phase.TEXT

    # --- TokenConstraint -------------------------------------------------------------------------
    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        ph = self.phase
        if ph == Phase.CALL:
            row = self.trie.mask_row(self.node, self.subset)
        elif ph == Phase.TEXT:
            row = self.f.text_row(self.q, self.trie, self.subset, self.eos)
        elif ph == Phase.ARGS:
            self.matcher.fill(bitmask, index)  # opaque tokens are never in its rows
            return
        elif ph == Phase.AFTER:
            row = self.f.after_row(self.trie, self.subset, self.eos, self.plan.parallel)
        else:
            row = self.f.eos_row(self.eos)
        self._write(bitmask, index, row)

    def accept_token(self, token_id: int) -> bool:
        if self.phase == Phase.ERROR:
            return False
        try:
            return self._accept(int(token_id))
        except Exception as exc:  # never raise inside the decode loop
            return self._reject(f"internal error in the tool constraint ({type(exc).__name__}: {exc})")

    def is_terminated(self) -> bool:
        ph = self.phase
        return ph >= Phase.DONE or (ph == Phase.AFTER and not self.plan.parallel)

    # --- internals -------------------------------------------------------------------------------
    def _view(self, bitmask: Any) -> Any:
        """A numpy view of a CPU bitmask (cached: engines reuse one buffer); the tensor itself if not."""
        if bitmask is not self._bm:
            self._bm = bitmask
            cpu = isinstance(bitmask, np.ndarray) or bitmask.device.type == "cpu"
            self._arr = bitmask if isinstance(bitmask, np.ndarray) else bitmask.numpy() if cpu else bitmask
        return self._arr

    def _write(self, bitmask: Any, index: int, row: np.ndarray) -> None:
        arr = self._view(bitmask)
        if isinstance(arr, np.ndarray):
            arr[index] = row
        else:  # a device bitmask: one host-to-device copy
            import torch

            arr[index].copy_(torch.from_numpy(row))

    def _what(self, tid: int) -> str:
        vocab = self.f.vocab
        return vocab.describe(tid) if 0 <= tid < vocab.vocab_size else f"<out of range id {tid}>"

    def _reject(self, message: str) -> bool:
        self.error = message
        self.phase = Phase.ERROR
        return False

    def _accept(self, tid: int) -> bool:
        ph, vocab = self.phase, self.f.vocab
        text = vocab.token_bytes[tid] if 0 <= tid < vocab.vocab_size else b""
        if ph == Phase.TEXT:
            if tid in self.eos_set:
                self.phase = Phase.DONE
                return True
            if not text:
                return self._reject(f"special token {self._what(tid)} is not allowed in the text of a reply")
            q, off = self.f.watch.step(self.q, tid)
            if off < 0:
                self.q = q
                return True
            if self.trie is None:
                return self._reject(
                    f"token {self._what(tid)} would open a tool call ({self.f.envelope.call_tag}), "
                    f"but no tool may be called now (mode {self.plan.mode})"
                )
            st = self.trie.walk(self.trie.node_of(self.f.tag_prefix), text[off:], self.subset)
            if st is None:
                return self._reject(
                    f"token {self._what(tid)} opens a tool call that cannot continue to an allowed tool"
                )
            return self._advance(st)
        if ph == Phase.CALL:
            st = self.trie.step(self.node, tid, self.subset)
            if st is None:
                where = "name" if self.node >= self.trie.name_start else "opening"
                return self._reject(
                    f"token {self._what(tid)} is not allowed in the {where} phase of a tool call "
                    f"(allowed tools: {', '.join(self.plan.allowed)})"
                )
            return self._advance(st)
        if ph == Phase.ARGS:
            if not text or not self.matcher.accept_token(tid):
                name = self.trie.names[self.tool]
                return self._reject(
                    f"token {self._what(tid)} is not allowed in the arguments of {name!r} "
                    "(they follow its JSON schema)"
                )
            if self.matcher.is_terminated():
                self.calls.append(self.trie.names[self.tool])
                self.phase, self.matcher = Phase.AFTER, None
            return True
        if ph == Phase.AFTER:
            if tid in self.eos_set:
                self.phase = Phase.DONE
                return True
            st = self.trie.step(0, tid, self.subset) if self.plan.parallel else None
            if st is None:
                more = " or another tool call" if self.plan.parallel else ""
                return self._reject(
                    f"token {self._what(tid)} is not allowed after a tool call: only end of sequence{more}"
                )
            return self._advance(st)
        return self._reject(f"token {self._what(tid)} came after the end of the reply")

    def _advance(self, st) -> bool:
        if st.node >= 0:
            self.phase, self.node = Phase.CALL, st.node
            return True
        self.tool = st.name
        self.matcher = self.f.backend.matcher(self.compiled[st.name])
        self.phase = Phase.ARGS
        if st.overflow and not self.matcher.accept_bytes(st.overflow):
            return self._reject(f"the arguments grammar rejected {st.overflow!r} after the name")
        return True
