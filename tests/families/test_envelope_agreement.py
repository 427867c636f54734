"""The contract between the two halves of a family: a tool call in the history is rendered
(grammars/families, as the official renderer writes it) with exactly the text the masks let the
model write (grammars/envelopes, ``Envelope.render_calls``) followed by one of the family's
end-of-turn tokens. Then the next turn's prompt starts with the previous prompt + the reply,
and the cache keeps the reply."""

from __future__ import annotations

import json

import pytest

from server.families.conversation import template_arguments
from server.families.envelope import load_envelope
from server.families.family import load_family
from server.families.render import FamilyRenderer
from server.protocol import ChatMessage

ARGS = [{"url": "https://a.org/x?q=1", "opts": {"wait": 3, "all": True}}, {"path": "/tmp", "n": 2}]


@pytest.mark.parametrize(
    "ref",
    [
        "hermes",
        "llama3_json",
        "mistral:v3",
        "mistral:v7",
        "mistral:v7_spm",
        "mistral:v11",
        "mistral:v13",
        "qwen3_coder",
    ],
)
@pytest.mark.parametrize("n_calls", [1, 2])
def test_history_call_text_is_what_the_envelope_writes(ref: str, n_calls: int) -> None:
    family = load_family(ref)
    envelope = load_envelope(family.envelope)
    if n_calls > 1 and not getattr(envelope, "parallel", True):
        pytest.skip(f"{family.envelope} writes one call per reply")
    calls = [(f"tool_{i}", json.dumps(ARGS[i]), f"abcdefgh{i}") for i in range(n_calls)]
    head = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="go")]
    turn = ChatMessage(
        role="assistant",
        content=None,
        tool_calls=[
            {"id": cid, "type": "function", "function": {"name": n, "arguments": a}} for n, a, cid in calls
        ],
    )
    renderer = FamilyRenderer(family)
    prompt = renderer.render(head, [], add_generation_prompt=True).text
    history = renderer.render([*head, turn], [], add_generation_prompt=False).text
    reply = envelope.render_calls([(n, template_arguments(a), cid) for n, a, cid in calls])
    assert history.startswith(prompt + reply), (prompt + reply, history)
    rest = history[len(prompt + reply) :]
    assert any(rest.startswith(eos) for eos in family.test_model["eos"]), rest


@pytest.mark.parametrize("keep", [False, True])
def test_harmony_history_is_what_the_model_wrote_only_with_keep_reasoning(keep: bool) -> None:
    """gpt-oss's template renders a past call in another form than the model writes it: with
    keep_reasoning the history is the reply as written (append-only), else the template's form."""
    family = load_family("harmony")
    envelope = load_envelope(family.envelope)
    args = json.dumps(ARGS[0])
    head = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="go")]
    call = {"id": "c1", "type": "function", "function": {"name": "tool_0", "arguments": args}}
    turn = ChatMessage(role="assistant", content=None, tool_calls=[call])
    renderer = FamilyRenderer(family, keep_reasoning=keep)
    prompt = renderer.render(head, [], add_generation_prompt=True).text
    history = renderer.render([*head, turn], [], add_generation_prompt=False).text
    reply = envelope.render_calls([("tool_0", template_arguments(args), "c1")])
    assert history.startswith(prompt + reply) == keep, (prompt + reply, history)
    if keep:
        assert history[len(prompt + reply) :].startswith("<|call|>")
    else:
        assert "<|start|>assistant to=functions.tool_0<|channel|>commentary json<|message|>" in history
