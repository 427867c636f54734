"""What an envelope means for the masks, precomputed once per (vocabulary, envelope).

The phases of ``ToolMatcher`` read everything envelope-specific from here:

* **Special tokens** of the envelope (``[TOOL_CALLS]``, ``[ARGS]``) as token ids; each
  must be one token of the vocabulary (else ``ValueError`` naming it).
* **Leads**: the text from a call's trigger to its name. ``lead`` is the one of a
  further (parallel) call, ``call_separator + call_start + name_open`` without a leading
  special token (Hermes ``\\n<tool_call>\\n{"name": "``; Mistral v3 ``, {"name": "``;
  Mistral v13 ``""`` after ``[TOOL_CALLS]``). The first call's lead is
  ``calls_open + call_start + name_open`` without the trigger token. When it is a
  suffix of ``lead`` (Hermes, Qwen3-Coder, Llama, Mistral v13) one trie serves both and
  the first call enters it at ``first_offset`` (Hermes: after the ``\\n``); otherwise
  (Mistral v3's ``[{"name": "``) it gets its own trie.
* **Name end**: a byte (the first of ``name_close``; the rest, ``close_rest``, opens the
  arguments grammar) or a special token (``term_token``, Mistral's ``[ARGS]``). Mistral
  v11's ``[CALL_ID]{call_id}[ARGS]``: the name ends with ``[CALL_ID]``, then ``call_id``
  (``call_id.py``) masks the id and ``[ARGS]`` before the arguments grammar; a rest
  holding special tokens (Harmony's name ends with a space, then ``<|constrain|>json<|message|>``)
  is forced by ``literal`` (``LiteralMasks``) there.
* **Trigger**: ``text`` — a KMP watch for the call tag (``TagWatch``); ``token`` — the
  trigger token id; ``start`` — the reply must begin with the opening to be a call:
  the first token either enters the trie, or is text that *diverges* from the opening
  (tokens that are a prefix of the opening or extend it are never text there, so a
  text reply can never read as a call).
* **Rows**: packed masks for the text phase, the start of a reply, after a call;
  cached per (state, trie, allowed subset, EOS ids).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from server.constrain.call_id import CallIdMasks, LiteralMasks
from server.constrain.row_cache import ROWS, owner_token
from server.constrain.tag_watch import TagWatch
from server.constrain.trie import NameTrie, compile_trie
from server.constrain.vocab import TokenVocab
from server.families.envelope import Envelope


class EnvelopeMasks:
    def __init__(self, vocab: TokenVocab, envelope: Envelope, tokenizer: Any = None) -> None:
        self.vocab, self.envelope = vocab, envelope
        env = envelope
        self.special_ids: dict[str, int] = {t: self._special_id(t, tokenizer) for t in env.special_tokens}
        close_tok = env.name_close_token
        self.term_token: int | None
        if close_tok:
            self.term, self.term_token = b"", self.special_ids[close_tok]
            self.close_rest = env.name_close[len(close_tok) :]
        else:
            self.term, self.term_token = env.name_close[:1].encode(), None
            self.close_rest = env.name_close[1:]
        self.call_id_masks: CallIdMasks | None = None  # Mistral v11: [CALL_ID] ID [ARGS] (call_id.py)
        if "{call_id}" in self.close_rest and env.call_id is not None:
            after = self.close_rest.split("{call_id}")[1]
            after_tok = env.leading_special(after) or ""  # Envelope checks it is there
            self.call_id_masks = CallIdMasks(vocab, env.call_id, self.special_ids[after_tok])
            self.close_rest = after[len(after_tok) :]
        self.literal_masks: LiteralMasks | None = None  # Harmony: " <|constrain|>json<|message|>"
        if self.call_id_masks is None and any(t in self.close_rest for t in env.special_tokens):
            ids = list(tokenizer(self.close_rest, add_special_tokens=False)["input_ids"])
            self.literal_masks = LiteralMasks(vocab, ids)
            self.close_rest = ""
        next_tok, next_text = env.strip_special(env.next_opening)
        self.next_token = self.special_ids[next_tok] if next_tok else None
        self.lead = next_text.encode()
        first_text = env.strip_special(env.opening)[1] if env.trigger == "token" else env.opening
        # a section's call start after the trigger (Kimi's <|tool_call_begin|>): forced, then the trie
        self.open_tokens: tuple[int, ...] = ()
        while env.trigger == "token" and (tok := env.leading_special(first_text)) is not None:
            self.open_tokens += (self.special_ids[tok],)
            first_text = first_text[len(tok) :]
        # a sectioned envelope (Kimi, DeepSeek): call_end forced after the arguments, then the next
        # call's start or calls_close, then the end of the reply
        self.end_tokens: tuple[int, ...] = (self.special_ids[env.call_end],) if env.sectioned else ()
        self.close_token: int | None = self.special_ids[env.calls_close] if env.sectioned else None
        first = first_text.encode()
        self.shared_trie = self.lead.endswith(first)
        self.first_lead = self.lead if self.shared_trie else first
        self.first_offset = self.lead[: len(self.lead) - len(first)] if self.shared_trie else b""
        self.trigger = env.trigger
        trigger_tok = env.trigger_token if env.trigger == "token" else None  # Envelope checks it exists
        self.trigger_id = self.special_ids[trigger_tok] if trigger_tok else None
        self.watch: TagWatch | None = None
        self.tag_prefix = b""  # trigger "text": the trie prefix where the tag completes
        if env.trigger == "text":
            self.watch = TagWatch(vocab, env.call_tag.encode())
            self.tag_prefix = self.first_offset + env.call_tag.encode()
        self.start_clash = self._start_clash(first) if env.trigger == "start" else np.zeros(0, dtype=np.int64)
        self.start_clash_set = frozenset(self.start_clash.tolist())
        # written by the last call's grammar (Mistral v3's "]"; a sectioned close is close_token)
        self.calls_close = b"" if env.sectioned else env.calls_close.encode()
        self._token = owner_token()  # its rows' key in the shared byte-bounded cache

    def _special_id(self, token: str, tokenizer: Any) -> int:
        tid = tokenizer.convert_tokens_to_ids(token) if tokenizer is not None else None
        unk = getattr(tokenizer, "unk_token_id", None)
        if (
            not isinstance(tid, int)
            or tid < 0
            or (tid == unk and token != getattr(tokenizer, "unk_token", None))
        ):
            raise ValueError(
                f"envelope {self.envelope.name!r} needs the special token {token!r}, which this tokenizer "
                f"does not have: pick the envelope of this model's family (model_family / envelope)"
            )
        if tid not in self.vocab.special_ids:
            raise ValueError(
                f"envelope {self.envelope.name!r}: {token!r} (id {tid}) is not a special token here"
            )
        return tid

    def _start_clash(self, opening: bytes) -> np.ndarray:
        """Tokens that are a prefix of the opening or extend it: never plain text at a reply's start."""
        ids = {tid for _, tid in self.vocab.prefixes_of(opening)} | set(self.vocab.starting_with(opening))
        return np.array(sorted(ids), dtype=np.int64)

    # --- tries -------------------------------------------------------------------------------------
    def next_trie(self, names: tuple[str, ...]) -> NameTrie:
        close = self.close_rest.encode()
        return compile_trie(self.vocab, names, self.lead, self.term, close, self.term_token)

    def first_trie(self, names: tuple[str, ...]) -> NameTrie:
        if self.shared_trie:
            return self.next_trie(names)
        close = self.close_rest.encode()
        return compile_trie(self.vocab, names, self.first_lead, self.term, close, self.term_token)

    def first_node(self, trie: NameTrie, text_after_trigger: bytes = b"") -> int | None:
        """The node of the first call's trie after the trigger (and ``text_after_trigger``)."""
        return trie.node_of(self.first_offset + text_after_trigger)

    def entry_node(self, trie: NameTrie) -> int:
        """The node of the first call's trie right after the trigger (always in the trie)."""
        node = trie.node_of(self.first_offset)
        assert node is not None, "the first call's lead starts with first_offset"
        return node

    def tag_node(self, trie: NameTrie) -> int | None:
        """Trigger ``text``: the node of the first call's trie where the call tag completes."""
        return trie.node_of(self.tag_prefix)

    # --- rows ----------------------------------------------------------------------------------------
    def cached(self, key: tuple[Any, ...], make: Callable[[], np.ndarray]) -> np.ndarray:
        return ROWS.get_or_make((self._token, *key), make)

    def eos_row(self, eos: tuple[int, ...]) -> np.ndarray:
        return self.cached(("eos", eos), lambda: self.vocab.pack(eos))

    def _plain(self, eos: tuple[int, ...], extra: tuple[int, ...] = ()) -> np.ndarray:
        return self.vocab.pack(np.concatenate([self.vocab.text_ids, np.array(eos + extra, dtype=np.int64)]))

    def text_row(self, q: int, trie: NameTrie | None, subset: int, eos: tuple[int, ...]) -> np.ndarray:
        """Free text (watch state q for a text trigger); a call may start only where allowed."""
        if self.trigger == "token":
            extra = (self.trigger_id,) if trie is not None and self.trigger_id is not None else ()
            return self.cached(("text", extra, eos), lambda: self._plain(eos, extra))
        if self.trigger == "start":  # past the start of the reply: a call can no longer begin
            return self.cached(("text", eos), lambda: self._plain(eos))

        def make() -> np.ndarray:
            assert self.watch is not None  # trigger "text"
            start = self.tag_node(trie) if trie is not None else None
            banned = [
                tid
                for tid, off in self.watch.complete[q].items()
                if start is None
                or trie is None
                or trie.walk(start, self.vocab.token_bytes[tid][off:], subset) is None
            ]
            row: np.ndarray = self._plain(eos) & ~self.vocab.pack(banned)
            return row

        return self.cached(("text", q, trie, subset, eos), make)

    def start_row(self, trie: NameTrie | None, subset: int, eos: tuple[int, ...]) -> np.ndarray:
        """The first token of a reply for trigger ``start``: diverging text, or the way into a call."""

        def make() -> np.ndarray:
            row: np.ndarray = self._plain(eos) & ~self.vocab.pack(self.start_clash)
            if trie is not None:
                row = row | trie.mask_row(self.entry_node(trie), subset)
            return row

        return self.cached(("start", trie, subset, eos), make)

    def after_row(self, trie: NameTrie, subset: int, eos: tuple[int, ...], parallel: bool) -> np.ndarray:
        """After a call: end of sequence or, with parallel calls, another call (separator or token)."""
        if (close := self.close_token) is not None:  # a section: the next call's start or its close
            nxt = (self.next_token,) if parallel and self.next_token is not None else ()
            return self.cached(("close", nxt), lambda: self.vocab.pack([close, *nxt]))
        if not parallel:
            return self.eos_row(eos)

        def make() -> np.ndarray:
            if self.next_token is not None:
                return self.vocab.pack(list(eos) + [self.next_token])
            row: np.ndarray = self.vocab.pack(eos) | trie.mask_row(0, subset)
            return row

        return self.cached(("after", trie, subset, eos), make)
