"""Issue 38 item 0: a tool-call reply sent back in the history reuses the tokens it was generated as.

Under the masks a model writes a call with its own split of the text (``' {' '"'`` where the
tokenizer has ``' {"'``); re-tokenizing the history lost the reply's KV after a few tokens
(embedded model: 4 of 19). Per family: the next prompt keeps the generated ids, its text is
unchanged, and the cache report counts the reply (``template_rewrote_history`` when the
history's tokens differ from the generated ones)."""

from __future__ import annotations

import functools
import json
from array import array
from typing import Any, cast

import pytest

from server.cache_diag import CacheState, Prompt, diagnose
from server.cache_diag.fingerprint import fingerprint
from server.chat.reply_tokens import decode, keep_reply
from server.families.conversation import template_arguments
from server.families.envelope import load_envelope
from server.families.family import load_family
from server.families.render import FamilyRenderer
from server.families.tokenizers import build_tokenizer
from server.protocol import ChatMessage
from tests.tokenizer_cache import tekken

FAMILIES = ["hermes", "llama3_json", "mistral:v3", "mistral:v7", "mistral:v11", "mistral:v13", "qwen3_coder"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell_exec",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]
CALLS = [
    ("shell_exec", json.dumps({"cmd": "ls -la /tmp"}), "abcdefgh0"),
    ("shell_exec", '{"cmd": "df"}', "abcdefgh1"),
]


@functools.cache
def _tokenizer(vocab: str) -> Any:
    if vocab == "tekken":  # converted once, cached on disk by the file's hash (tests/tokenizer_cache.py)
        return tekken()
    if vocab != "embedded":
        return build_tokenizer(vocab)
    from transformers import AutoTokenizer

    from server.model_store import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("embedded"))


def _encode(tok: Any, text: str) -> tuple[list[int], array[int]]:
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), array("l", (s for s, _ in enc["offset_mapping"]))


def _generated_ids(tok: Any, text: str, specials: list[str]) -> list[int]:
    """``text`` as a masked model may write it: plain runs one character at a time (a split the
    tokenizer itself would not choose), special tokens as their one id."""
    ids: list[int] = []
    at = 0
    while at < len(text):
        special = next((s for s in specials if text.startswith(s, at)), None)
        if special is not None:
            ids.extend(tok(special, add_special_tokens=False)["input_ids"])
            at += len(special)
            continue
        ids.extend(tok(text[at], add_special_tokens=False)["input_ids"])
        at += 1
    return ids


def _setup(ref: str, n_calls: int) -> tuple[Any, str, list[int], array[int], list[int], str]:
    family = load_family(ref)
    envelope = load_envelope(family.envelope)
    tok = _tokenizer(family.test_model["vocab"])
    calls = CALLS[:n_calls]
    head = [
        ChatMessage(role="system", content="You are a coding agent."),
        ChatMessage(role="user", content="go"),
    ]
    turn = ChatMessage(
        role="assistant",
        content=None,
        tool_calls=[
            {"id": cid, "type": "function", "function": {"name": n, "arguments": a}} for n, a, cid in calls
        ],
    )
    results = [ChatMessage(role="tool", tool_call_id=cid, content="ok") for _, _, cid in calls]
    renderer = FamilyRenderer(family)
    prompt = renderer.render(head, TOOLS, add_generation_prompt=True).text
    ids, offsets = _encode(tok, prompt)
    eos = family.test_model["eos"][0]
    reply_text = envelope.render_calls([(n, template_arguments(a), cid) for n, a, cid in calls]) + eos
    reply = _generated_ids(tok, reply_text, [*envelope.special_tokens, *family.test_model["eos"]])
    assert decode(tok, reply) == reply_text
    nxt = renderer.render([*head, turn, *results], TOOLS, add_generation_prompt=True).text
    assert nxt.startswith(prompt + reply_text)  # the history renders the call as it was written
    return tok, prompt, ids, offsets, reply, nxt


@pytest.mark.parametrize("ref", FAMILIES)
@pytest.mark.parametrize("n_calls", [1, 2])
def test_the_next_prompt_keeps_the_generated_reply_tokens(ref: str, n_calls: int) -> None:
    if n_calls == 2 and not load_envelope(load_family(ref).envelope).parallel:
        pytest.skip("one call per reply")
    tok, prompt, ids, offsets, reply, nxt = _setup(ref, n_calls)
    plain, _ = _encode(tok, nxt)
    assert plain[: len(ids) + len(reply)] != [*ids, *reply]  # re-tokenizing loses the reply's ids
    base = Prompt(
        cast(Any, None), array("l", ids), prompt, offsets, reply=reply, reply_text=decode(tok, reply)
    )
    kept = keep_reply(tok, nxt, base)
    assert kept is not None
    new_ids, new_offsets = kept
    assert new_ids[: len(ids) + len(reply)] == [*ids, *reply]
    assert decode(tok, new_ids) == nxt  # the same text: only the split of the reply is the generated one
    assert len(new_offsets) == len(new_ids)
    ends = [*new_offsets[1:], len(nxt)]
    assert all(a <= b for a, b in zip(new_offsets, ends, strict=True))
    at = len(ids) + len(reply)  # the first token after the reply starts where the reply's text ends
    assert new_offsets[at] == len(prompt) + len(decode(tok, reply))


def test_a_reply_rendered_back_differently_keeps_what_matches() -> None:
    tok, prompt, ids, offsets, reply, nxt = _setup("hermes", 1)
    edited = nxt.replace("ls -la", "ls -l ")  # the history differs from what was generated
    base = Prompt(
        cast(Any, None), array("l", ids), prompt, offsets, reply=reply, reply_text=decode(tok, reply)
    )
    kept = keep_reply(tok, edited, base)
    assert kept is not None
    new_ids, _ = kept
    assert decode(tok, new_ids) == edited
    n = len(ids)
    same = next(i for i in range(len(reply)) if new_ids[n + i] != reply[i])
    assert 0 < same < len(reply) and decode(tok, reply[:same]) in edited
    assert keep_reply(tok, "another prompt", base) is None


def _fp(tok: Any, text: str, ids: list[int], offsets: array[int]) -> Any:
    from server.families.rendered import RenderedPrompt, Segment

    rendered = RenderedPrompt(text, (Segment(0, len(text), "prompt"),), ())
    return fingerprint(model="m", settings={}, ids=ids, offsets=offsets, rendered=rendered)


def test_the_cache_report_counts_the_reply_and_names_the_rewrite() -> None:
    """Before: the baseline was the previous prompt without its generation, so a reply whose KV was
    lost on re-tokenization read ``type: null, missed_tokens: 0``."""
    tok, prompt, ids, offsets, reply, nxt = _setup("hermes", 2)
    base = Prompt(
        _fp(tok, prompt, ids, offsets),
        array("l", ids),
        prompt,
        offsets,
        reply=reply,
        reply_text=decode(tok, reply),
    )
    plain, plain_offsets = _encode(tok, nxt)
    cur = Prompt(_fp(tok, nxt, plain, plain_offsets), array("l", plain), nxt, plain_offsets)
    same = next(i for i in range(len(reply)) if plain[len(ids) + i] != reply[i])
    cached = len(ids) + same  # what the engine reuses of the re-tokenized history
    d = diagnose(base, cur, CacheState(cached, 1))
    assert d.type == "template_rewrote_history"
    # the reply as generated (capped by the prompt: the engine recomputes its last token)
    # the reply's last token was sampled, never run through the model: no KV of it to reuse
    assert d.missed_tokens == min(len(ids) + len(reply) - 1, len(plain) - 1) - cached > 0
    assert d.detail["segment"] == "reply" and d.detail["reply_token"] == same
    spliced = keep_reply(tok, nxt, base)
    assert spliced is not None
    s_ids, s_offsets = spliced
    cur = Prompt(_fp(tok, nxt, s_ids, s_offsets), array("l", s_ids), nxt, s_offsets)
    ok = diagnose(base, cur, CacheState(len(ids) + len(reply), 1))
    assert ok.type is None and ok.missed_tokens == 0
    lost = diagnose(base, cur, CacheState(len(ids), 1))  # the reply's KV was evicted: counted
    assert lost.type == "evicted" and lost.missed_tokens == len(reply) - 1
