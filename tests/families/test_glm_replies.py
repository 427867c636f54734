"""What the masks let a GLM model write parses as allowed calls that follow their schema, and sent
back as the next request's history (as a client sends it: content, reasoning_content, tool_calls,
then the tool results) renders the previous prompt + the reply + the end-of-turn token it stopped on:
the session is append-only (a tool loop's reasoning is after the last user message, which the template
keeps; before a new user message, with ``keep_reasoning``: GLM-4.7's ``clear_thinking=false``).

Replies: tests/families/masked_replies.py (the request's real constraint, seeded random logits, every
tool_choice form, parallel or not). A reply whose text has spaces around the reasoning or before a
call is the exception the template itself makes (it writes both ``.strip()``ped): counted, not failed.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from server.constrain.arguments.seam import tool_schema
from server.families.render import FamilyRenderer
from server.protocol import ChatMessage
from tests.families.masked_replies import FORMS, NAMES, TOOLS, masked_reply, official, parse_reply

SCHEMAS = {t["function"]["name"]: tool_schema(t) for t in TOOLS}
HEAD: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Fix it."},
]


def _render(ref: str, messages: list[dict[str, Any]], keep: bool = False) -> str:
    return FamilyRenderer(ref, keep_reasoning=keep).render([ChatMessage(**m) for m in messages], TOOLS).text


def _as_the_template_writes(ref: str, text: str, calls: bool) -> bool:
    """No whitespace around the reasoning or the text (the template writes them ``.strip()``ped), and
    for GLM-4.5 some text after the newline the masks write after ``</think>`` when there is no call."""
    reasoning = official(ref).family.reasoning
    assert reasoning is not None
    raw, _, answer = text[len(reasoning.open) :].partition(reasoning.close_tag)
    answer = answer[len(reasoning.close) - len(reasoning.close_tag) :]  # GLM-4.5's forced "\n"
    head = answer.split(official(ref).envelope.call_separator + "<tool_call>")[0] if calls else answer
    return (
        raw == raw.strip()
        and head == head.strip()
        and (calls or bool(head) or not reasoning.close.endswith("\n"))
    )


@pytest.mark.parametrize("ref", ["glm47", "glm45"])
def test_replies_parse_validate_and_the_next_prompt_extends_the_last(ref: str) -> None:
    prompt = _render(ref, HEAD)
    appended = stripped = 0
    for seed in range(6):
        for i, form in enumerate(FORMS):
            subset = NAMES[(seed + i) % 3 :] if form != "named" else (NAMES[(seed + i) % 3],)
            reply = masked_reply(ref, form, subset, seed % 2 == 0, seed)
            assert reply.error is None, reply.error
            reasoning, content, calls, unfinished = parse_reply(ref, reply.text)
            if not reply.finished:  # cut by max_tokens inside a value: the complete calls before it
                assert unfinished is not None and [n for n, _ in calls] == list(reply.calls[: len(calls)])
                continue
            assert unfinished is None and [n for n, _ in calls] == list(reply.calls), reply.text
            allowed = reply.plan.allowed if form != "none" else ()
            for name, args in calls:
                assert name in allowed
                jsonschema.validate(json.loads(args), SCHEMAS[name])
            if form in ("required", "named", "allowed_required"):
                assert calls, reply.text
            ids = [f"call_{seed}_{k}" for k in range(len(calls))]
            turn = {
                "role": "assistant",
                "content": content,
                "reasoning_content": reasoning,
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
                    for cid, (n, a) in zip(ids, calls, strict=True)
                ]
                or None,
            }
            after = [{"role": "tool", "tool_call_id": cid, "content": "ok"} for cid in ids] or [
                {"role": "user", "content": "Thanks."}
            ]
            # after a new user message the template drops the turn's reasoning (a rewrite the cache
            # report names); keep_reasoning (GLM-4.7's clear_thinking=false) keeps the session appending
            nxt = _render(ref, [*HEAD, turn, *after], keep=not calls)
            eos = "<|observation|>" if calls else "<|user|>"
            if not _as_the_template_writes(ref, reply.text, bool(calls)):
                stripped += 1  # the template writes both stripped: not what the model wrote
                continue
            assert nxt.startswith(prompt + reply.text + eos), (reply.text, nxt[len(prompt) :])
            appended += 1
    assert appended >= 5, (appended, stripped)  # random text often ends its reasoning with a space


def test_official_vocab_tags_are_one_token() -> None:
    tok = official("glm47").tokenizer
    for tag in ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_value>", "<think>", "</think>"):
        assert len(tok.encode(tag, add_special_tokens=False)) == 1, tag
