"""Which token ids end a reply: the one place it is decided, from the model and its family's data.

A reply ends at the tokenizer's EOS, at the end-of-turn tokens of the model's family (the
``eos`` list of ``test_model`` in grammars/families/NAME.yaml: the tokens that close an
assistant turn in that format, which ``make-test-model`` also gives a test model), and at
the model config's EOS ids, in that order, without duplicates. A token the vocabulary
does not know (or knows only as its unknown token) is skipped. Both engines take their
stop set and the masks' EOS from here (``Engine.eos_token_ids``); the vLLM logits
processor too, for a spec that carries no EOS ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from server.families.family import Family


def family_end_tokens(family: Family) -> tuple[str, ...]:
    """The family's end-of-turn tokens, as text (empty: the model's own EOS ids alone)."""
    return tuple(str(t) for t in family.test_model.get("eos") or ())


def reply_end_ids(
    tokenizer: Any, end_tokens: Sequence[str] = (), config_eos: int | list[int] | None = None
) -> tuple[int, ...]:
    """The tokenizer's EOS, the ``end_tokens`` it knows, then the model config's EOS ids."""
    ids: list[int] = []
    if tokenizer is not None:
        for name in (tokenizer.eos_token, *end_tokens):
            tid = tokenizer.convert_tokens_to_ids(name) if name else None
            if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid not in ids:
                ids.append(tid)
    for tid in config_eos if isinstance(config_eos, list) else [config_eos]:
        if isinstance(tid, int) and tid not in ids:
            ids.append(tid)
    return tuple(ids)
