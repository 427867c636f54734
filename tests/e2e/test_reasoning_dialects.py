"""A reasoning family's reasoning in the Responses and Messages dialects, through the official SDKs.

Responses: a ``reasoning`` output item (``reasoning_text`` content) before the call, streamed as
``response.reasoning_text.delta`` events; sent back in ``input`` it renders as the turn's
reasoning (with ``keep_reasoning`` the next prompt starts with the previous one). Messages: a
``thinking`` block with a ``signature`` before the ``tool_use``, streamed as ``thinking_delta``
then ``signature_delta`` (the SDK's stream accumulator rebuilds the same message).
``reasoning.effort`` and ``thinking.budget_tokens`` set the budget.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from tests.e2e import test_reasoning_api as base

served = base.served  # the module's fixture: a tiny model per reasoning family, two servers
MODEL, TOOLS = base.MODEL, base.TOOLS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
ANTHROPIC_TOOLS = [
    {"name": t["function"]["name"], "description": "x", "input_schema": t["function"]["parameters"]}
    for t in TOOLS
]
SAMPLING = {"temperature": 1.0, "seed": 5}


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def _anthropic(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)


def test_responses_reasoning_item_then_the_call_stream_equals_create(served) -> None:
    _, urls, _ = served
    client = _openai(urls[True])
    kw = {
        "model": MODEL,
        "input": "List the root folder.",
        "tools": RESPONSES_TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_output_tokens": 120,
        "temperature": 1.0,
        "extra_body": {"max_reasoning_tokens": 10, "seed": 5},
    }
    r = client.responses.create(**kw)
    kinds = [item.type for item in r.output]
    assert kinds[0] == "reasoning" and kinds[-1] == "function_call", kinds
    thought = r.output[0].content[0].text
    assert thought and r.output[0].summary == []
    deltas, done = "", None
    with client.responses.stream(**kw) as stream:
        for event in stream:
            if event.type == "response.reasoning_text.delta":
                deltas += event.delta
            elif event.type == "response.reasoning_text.done":
                done = event.text
        final = stream.get_final_response()
    assert deltas == done == thought
    assert [_item(i) for i in final.output] == [_item(i) for i in r.output]
    # usage counts the reasoning's tokens (the open and close tags included), not the call's
    reasoning_tokens = r.usage.output_tokens_details.reasoning_tokens
    assert 0 < reasoning_tokens < r.usage.output_tokens
    assert final.usage.output_tokens_details.reasoning_tokens == reasoning_tokens
    # the output sent back as input (+ the call's result): the reasoning renders, the prompt only grows
    call = r.output[-1]
    items = [i.model_dump(exclude_none=True) for i in r.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "a b"})
    again = client.responses.create(
        **{**kw, "input": [{"role": "user", "content": "List the root folder."}, *items]}
    )
    cache = again.model_extra["cache"]
    assert cache["diverged_at_token"] is None and cache["cached_tokens"] > 0, cache


def _item(item) -> tuple:
    """What must match between a stream and a create (ids differ per response)."""
    if item.type == "reasoning":
        return ("reasoning", [c.text for c in item.content or []])
    return (item.type, getattr(item, "name", None), getattr(item, "arguments", None))


def test_responses_effort_sets_the_budget(served) -> None:
    ref, urls, _ = served
    from server.families.family import load_family

    family = load_family(ref).reasoning
    client = _openai(urls[False])
    r = client.responses.create(
        model=MODEL,
        input="Go.",
        tools=RESPONSES_TOOLS,
        tool_choice="required",
        max_output_tokens=200,
        reasoning={"effort": "minimal"},
        extra_body={"seed": 1},
    )
    # "minimal" → 64 tokens: the reasoning closes within them (never the 2048 of "medium")
    assert r.output[0].type == "reasoning" and r.output[-1].type == "function_call"
    # "none": off (the family's off tail) or, where it has none (gpt-oss, Magistral), closed at once
    off_kw = {"model": MODEL, "input": "Go.", "tools": RESPONSES_TOOLS, "tool_choice": "required"}
    off = client.responses.create(**off_kw, reasoning={"effort": "none"})
    assert {i.type for i in off.output} == {"function_call"}
    assert family is not None and family.efforts["minimal"] < 200


def test_messages_thinking_block_then_tool_use_stream_equals_create(served) -> None:
    _, urls, _ = served
    client = _anthropic(urls[True])
    kw = {
        "model": MODEL,
        "max_tokens": 120,
        "messages": [{"role": "user", "content": "List the root folder."}],
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 10},
        "extra_body": {"temperature": 1.0, "seed": 5},
    }
    m = client.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "tool_use"], m.content
    assert m.content[0].thinking and m.content[0].signature and m.stop_reason == "tool_use"
    with client.messages.stream(**kw) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" in kinds and kinds.count("signature_delta") == 1
    assert [b.model_dump(exclude={"id"}) for b in final.content] == [
        b.model_dump(exclude={"id"}) for b in m.content
    ]
    # sent back, the thinking block is the turn's reasoning: append-only with keep_reasoning
    use = m.content[1]
    history = [
        *kw["messages"],
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a b"}]},
    ]
    again = client.messages.create(**{**kw, "messages": history})
    assert again.model_extra["cache"]["diverged_at_token"] is None, again.model_extra["cache"]


def test_messages_thinking_disabled_gives_no_thinking_block(served) -> None:
    _, urls, _ = served
    kw = {
        "model": MODEL,
        "max_tokens": 60,
        "messages": [{"role": "user", "content": "Go."}],
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "any"},
        "thinking": {"type": "disabled"},
    }
    m = _anthropic(urls[False]).messages.create(**kw)
    assert m.content and {b.type for b in m.content} == {"tool_use"}, m.content  # no thinking block
    assert json.loads(json.dumps(m.content[0].input)) is not None
