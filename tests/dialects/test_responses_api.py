"""POST /v1/responses end to end with the official openai SDK on the embedded model."""

from __future__ import annotations

import hashlib
import json

import openai
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
RULES = "You are a careful coding agent. " + " ".join(f"Rule {i}: check your work." for i in range(40))
READ = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    "strict": False,
}
CRM = {
    "type": "namespace",
    "name": "crm",
    "description": "Customer records",
    "tools": [
        {
            "type": "function",
            "name": "lookup",
            # a short bound: the 135M model's free-running string would outlast max_output_tokens
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string", "maxLength": 8}},
                "required": ["q"],
            },
        }
    ],
}


def create(client, key, **kw):
    kw.setdefault("max_output_tokens", 12)
    kw.setdefault("temperature", 0)
    return client.responses.create(model=MODEL, prompt_cache_key=key, **kw)


def test_text_reply_usage_and_id(client):
    r = create(client, "resp-text", instructions=RULES, input="Say hello.", max_output_tokens=6)
    assert r.object == "response" and r.status == "incomplete"  # 6 tokens cut it
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text and r.output[0].type == "message"
    assert r.usage.input_tokens > 100 and r.usage.output_tokens == 6
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # the id carries the session hash (the router's key for previous_response_id)
    assert r.id[5:21] == hashlib.sha256(b"resp-text").hexdigest()[:16]
    assert r.model_extra["cache"]["session_key_source"] == "prompt_cache_key"


def test_required_function_call_then_the_loop_replays_it_from_cache(client):
    tools = [READ, {"type": "web_search"}]
    first = [{"role": "user", "content": "Show me README.md"}]
    r1 = create(
        client,
        "resp-loop",
        instructions=RULES,
        input=first,
        tools=tools,
        tool_choice="required",
        max_output_tokens=40,
    )
    calls = [o for o in r1.output if o.type == "function_call"]
    assert r1.status == "completed" and len(calls) >= 1
    assert calls[0].name == "read_file" and isinstance(json.loads(calls[0].arguments), dict)
    assert r1.model_extra["agentserve"]["dropped_tools"] == [{"index": 1, "type": "web_search"}]
    # turn 2: the history as Codex replays it (a reasoning item with encrypted_content included)
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB-opaque"}
    history = first + [reasoning] + [o.model_dump(exclude_none=True) for o in r1.output]
    history += [
        {"type": "function_call_output", "call_id": c.call_id, "output": "# agentserve"} for c in calls
    ]
    r2 = create(client, "resp-loop", instructions=RULES, input=history, tools=tools, tool_choice="none")
    assert r2.status in ("completed", "incomplete") and all(o.type == "message" for o in r2.output)
    assert r2.usage.input_tokens > r1.usage.input_tokens
    assert r2.usage.input_tokens_details.cached_tokens >= 0.8 * r1.usage.input_tokens


def test_namespace_tool_call_names_the_namespace(client):
    r = create(
        client,
        "resp-ns",
        input="Find customer Ada",
        tools=[CRM],
        tool_choice="required",
        max_output_tokens=40,
    )
    call = next(o for o in r.output if o.type == "function_call")
    assert (call.name, call.namespace) == ("lookup", "crm")
    # replaying it (with its namespace) is accepted and renders the flat name back
    history = [{"role": "user", "content": "Find customer Ada"}, call.model_dump(exclude_none=True)]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "none"})
    r2 = create(client, "resp-ns", input=history, tools=[CRM], tool_choice="none", max_output_tokens=4)
    assert r2.usage.input_tokens_details.cached_tokens > 0


def test_stream_events_in_order_and_deltas_join(client):
    stream = client.responses.create(
        model=MODEL,
        input="Write one sentence about the sea.",
        max_output_tokens=16,
        temperature=0,
        stream=True,
    )
    events = list(stream)
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if events[-1].response.status == "incomplete" else "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    assert deltas == done.text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens > 0
    full = client.responses.create(
        model=MODEL, input="Write one sentence about the sea.", max_output_tokens=16, temperature=0
    )
    assert full.output_text == deltas


def test_stream_helper_function_call(client):
    with client.responses.stream(
        model=MODEL,
        input="Read notes.txt",
        tools=[READ],
        tool_choice="required",
        max_output_tokens=40,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert args == done.arguments and json.loads(args)
    assert final.output[-1].type == "function_call" and final.output[-1].arguments == args


def test_cut_call_never_leaks_into_text(client):
    for stream in (False, True):
        kw = {"tools": [READ], "tool_choice": "required", "max_output_tokens": 4, "temperature": 0}
        if stream:
            final = list(client.responses.create(model=MODEL, input="Read a.txt", stream=True, **kw))[-1]
            assert final.type == "response.incomplete"
            r = final.response
        else:
            r = client.responses.create(model=MODEL, input="Read a.txt", **kw)
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert r.output == [] and r.output_text == ""
        assert r.model_extra["agentserve"]["incomplete_tool_call"]["name"]


def test_previous_response_id_with_store_and_get_delete(client):
    r1 = create(client, "resp-store", input="Name a color.", max_output_tokens=5)
    r2 = create(client, "resp-store", input="And another.", previous_response_id=r1.id, max_output_tokens=5)
    alone = create(client, "resp-store-alone", input="And another.", max_output_tokens=5)
    assert r2.previous_response_id == r1.id
    # the stored turn (the user message and the reply) came before the new input
    assert r2.usage.input_tokens >= alone.usage.input_tokens + r1.usage.output_tokens + 4
    assert r2.usage.input_tokens_details.cached_tokens > 0
    assert client.responses.retrieve(r1.id).id == r1.id
    client.responses.delete(r1.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r1.id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        create(client, "resp-store", input="x", previous_response_id=r1.id)
    r3 = create(client, "resp-store", input="x", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r3.id)


def test_comparison_response_id_gives_prompt_cache_diagnostics(client):
    r1 = create(client, "resp-diag", instructions=RULES, input="hello", tools=[READ], max_output_tokens=3)
    other = dict(READ, name="open_file")
    r2 = create(
        client,
        "resp-diag",
        instructions=RULES,
        input="hello",
        tools=[other],
        max_output_tokens=3,
        extra_body={"prompt_cache_options": {"comparison_response_id": r1.id}},
    )
    diag = r2.prompt_cache_diagnostics
    assert diag.type == "cache_miss" and diag.reason == "tools_changed" and diag.cache_missed_tokens > 0
    r3 = create(
        client,
        "resp-diag",
        input="hello",
        extra_body={"prompt_cache_options": {"comparison_response_id": "resp_x"}},
    )
    assert r3.prompt_cache_diagnostics.type == "comparison_response_not_found"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "computer_call_output"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "text only"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "call_id"),
        ({"input": "x", "tools": [{"type": "custom", "name": "c", "format": {"type": "grammar"}}]}, "format"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"input": "x", "model": "gpt-5"}, "model"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({}, "input"),
    ],
)
def test_bad_input_is_a_400_in_openai_shape(server_url, body, words):
    import httpx

    r = httpx.post(server_url + "/v1/responses", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and words in err["message"]
