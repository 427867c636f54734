"""Keep the generated tokens: a prompt that renders the previous reply back reuses its token ids.

Under the tool masks a model may write a call with another split of the same text than the
tokenizer's (``' {' '"'`` where a fresh tokenization has ``' {"'``; ``'}' '}'`` for ``'}}'``),
and a sampled text reply can do the same. Re-tokenizing the history then changes the token
ids a few tokens into the reply, and the reply's KV (which the engine keeps) is not reused:
on the embedded model 4 of 19 tokens of a tool-call reply were. So when the rendered prompt
begins with the session's previous prompt and then the text of its reply (prefill + generated
tokens), those ids are kept as they were, and only the rest is tokenized. What the model sees
is the same text; where the template renders the reply differently, only the part before the
first difference is kept (the cache report names that ``template_rewrote_history``).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from server.cache_diag import Prompt

MAX_REPLY_TOKENS = 8192  # longer replies: the text of each token prefix costs too much to find


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return str(tokenizer.decode(list(ids), skip_special_tokens=False))


def text_ends(tokenizer: Any, ids: Sequence[int]) -> list[int]:
    """The length of the text of ``ids[:j + 1]`` for each j (exact, also across split characters)."""
    pieces = [decode(tokenizer, [t]) for t in ids]
    full = decode(tokenizer, ids)
    if "".join(pieces) == full:
        out, n = [], 0
        for p in pieces:
            n += len(p)
            out.append(n)
        return out
    return [len(decode(tokenizer, ids[: j + 1])) for j in range(len(ids))]  # SentencePiece spaces


def keep_reply(tokenizer: Any, text: str, base: Prompt | None) -> tuple[list[int], array[int]] | None:
    """Token ids and start offsets of ``text`` that keep ``base``'s prompt + reply ids where
    ``text`` begins with their text; None when it does not begin with the baseline's prompt."""
    if base is None or base.ids is None or base.text is None or base.offsets is None or not base.reply:
        return None
    if len(base.reply) > MAX_REPLY_TOKENS or not text.startswith(base.text):
        return None
    ends = text_ends(tokenizer, base.reply)
    reply_text = decode(tokenizer, base.reply)
    rest_at = len(base.text)
    tail = text[rest_at:]
    kept = 0
    for j, end in enumerate(ends):
        if end > len(tail) or reply_text[:end] != tail[:end]:
            break
        kept = j + 1
    ids = [*base.ids, *base.reply[:kept]]
    starts = array("l", base.offsets)
    prev = 0
    for end in ends[:kept]:
        starts.append(rest_at + prev)
        prev = end
    cut = rest_at + (ends[kept - 1] if kept else 0)
    enc = tokenizer(text[cut:], add_special_tokens=False, return_offsets_mapping=True)
    ids.extend(enc["input_ids"])
    starts.extend(cut + s for s, _ in enc["offset_mapping"])
    return ids, starts
