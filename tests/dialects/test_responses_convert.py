"""The Responses adapter's conversions on hand-made dicts (no model): request → chat,
chat → response object, chat chunks → stream events (validated by the openai SDK's own types),
the store, and the id that carries the session hash."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from server.dialects.responses.request import to_chat
from server.dialects.responses.response import (
    ResponseContext,
    diagnostics,
    from_chat,
)
from server.dialects.responses.response_store import ResponseStore
from server.dialects.responses.stream import ResponsesStream
from server.dialects.responses.tools import convert_tool_choice, convert_tools, flat_name
from server.errors import InvalidRequest
from server.protocol import ChatCompletionRequest

EVENT = TypeAdapter(ResponseStreamEvent)
FN = {"type": "function", "name": "read_file", "parameters": {"type": "object"}, "strict": False}
NS = {
    "type": "namespace",
    "name": "mcp__github__",
    "description": "GitHub",
    "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}],
}
CRM = {
    "type": "namespace",
    "name": "crm",
    "description": "CRM",
    "tools": [{"type": "function", "name": "lookup"}],
}
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch"'},
}


def test_key_order_instructions_and_string_input():
    body = {
        "model": "m",
        "prompt_cache_key": "k",
        "instructions": "Be brief.",
        "input": "hi",
        "max_output_tokens": 5,
    }
    chat = to_chat(body).chat
    assert list(chat) == ["model", "prompt_cache_key", "messages", "max_tokens"]
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    ChatCompletionRequest.model_validate(chat)


def test_items_replay_calls_outputs_and_reasoning():
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA-opaque"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Let me look."}],
        },
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "read_file", "arguments": '{"p":1}'},
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "search",
            "namespace": "mcp__github__",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "file text"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "found"}],
        },
        {"type": "custom_tool_call", "call_id": "c3", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c3", "output": "done"},
    ]
    conv = to_chat({"model": "m", "input": items, "tools": [FN, NS, PATCH]})
    msgs = conv.chat["messages"]
    assert msgs[0] == {"role": "developer", "content": "rules"}
    assert msgs[1] == {"role": "user", "content": "ab"}
    assert (
        msgs[2]["content"] == "Let me look."
    )  # the reasoning item renders nothing; the calls join the message
    assert [c["function"]["name"] for c in msgs[2]["tool_calls"]] == ["read_file", "mcp__github__search"]
    assert msgs[3] == {"role": "tool", "tool_call_id": "c1", "content": "file text"}
    assert msgs[4]["content"] == "found"
    assert msgs[5]["tool_calls"] == [
        {"id": "c3", "type": "custom", "custom": {"name": "apply_patch", "input": "*** Begin Patch"}}
    ]
    assert conv.input_items == items  # the conversation as sent (encrypted reasoning kept for the store)


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ({"type": "web_search_call", "id": "ws"}, "web_search_call"),
        ({"type": "item_reference", "id": "x"}, "item_reference"),
        ({"type": "function_call", "name": "f", "arguments": "{}"}, "call_id"),
        ({"type": "message", "role": "tool", "content": "x"}, "role"),
        ({"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}, "input_image"),
        ("just a string", "not an item"),
    ],
)
def test_bad_items_are_400s_that_say_what(item, words):
    with pytest.raises(InvalidRequest) as err:
        to_chat({"model": "m", "input": [item]})
    assert words in err.value.message and err.value.param.startswith("input[0]")


def test_tools_function_namespace_custom_and_hosted():
    tools, names = convert_tools(
        [FN, NS, CRM, PATCH, {"type": "web_search"}, {"type": "mcp", "server_label": "x"}]
    )
    assert tools[0] == {
        "type": "function",
        "function": {"name": "read_file", "parameters": {"type": "object"}, "strict": False},
    }
    assert [t["function"]["name"] for t in tools[1:3]] == ["mcp__github__search", "crm__lookup"]
    assert tools[3] == {
        "type": "custom",
        "custom": {
            "name": "apply_patch",
            "description": "Edit files",
            "format": {
                "type": "grammar",
                "grammar": {"syntax": "lark", "definition": 'start: "*** Begin Patch"'},
            },
        },
    }
    assert names.dropped == [{"index": 4, "type": "web_search"}, {"index": 5, "type": "mcp"}]
    assert names.item_name("crm__lookup") == ("lookup", "crm")
    assert names.item_name("mcp__github__search") == ("search", "mcp__github__")
    assert names.item_name("read_file") == ("read_file", None)
    assert flat_name("crm", "lookup") == "crm__lookup"


def test_custom_text_format_and_bad_formats():
    tools, _ = convert_tools([{"type": "custom", "name": "say", "format": {"type": "text"}}])
    assert tools[0]["custom"]["format"] == {"type": "text"}
    with pytest.raises(InvalidRequest, match="lark"):
        convert_tools(
            [
                {
                    "type": "custom",
                    "name": "x",
                    "format": {"type": "grammar", "syntax": "ebnf", "definition": "a"},
                }
            ]
        )
    with pytest.raises(InvalidRequest, match="twice"):
        convert_tools([{"type": "function", "name": "crm__lookup"}, CRM])
    with pytest.raises(InvalidRequest, match="name"):
        convert_tools([{"type": "function", "parameters": {}}])


def test_tool_choice_forms():
    _, names = convert_tools([FN, CRM, PATCH, {"type": "web_search"}])
    assert convert_tool_choice("required", names) == "required"
    assert convert_tool_choice({"type": "function", "name": "read_file"}, names) == {
        "type": "function",
        "function": {"name": "read_file"},
    }
    assert convert_tool_choice({"type": "function", "name": "lookup", "namespace": "crm"}, names) == {
        "type": "function",
        "function": {"name": "crm__lookup"},
    }
    assert convert_tool_choice({"type": "custom", "name": "apply_patch"}, names) == {
        "type": "custom",
        "custom": {"name": "apply_patch"},
    }
    allowed = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "read_file"}, {"type": "web_search"}],
    }
    chat = convert_tool_choice(allowed, names)
    assert chat == {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name": "read_file"}}],
        },
    }
    with pytest.raises(InvalidRequest, match="cannot run"):
        convert_tool_choice({"type": "web_search_preview"}, names)


def test_parameters_map_or_refuse():
    body = {
        "model": "m",
        "input": "x",
        "text": {
            "format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}, "strict": True}
        },
        "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "store": False,
        "truncation": "auto",
        "client_metadata": {"a": "b"},
        "prompt_cache_retention": "24h",
        "prompt_cache_options": {"comparison_response_id": "resp_x"},
        "stream": True,
    }
    chat = to_chat(body).chat
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "r", "schema": {"type": "object"}, "strict": True},
    }
    assert chat["stream_options"] == {"include_usage": True}
    assert ChatCompletionRequest.model_validate(chat).comparison_response_id() == "resp_x"
    for key, value in (("background", True), ("truncation", "middle"), ("conversation", "conv_1")):
        with pytest.raises(InvalidRequest) as err:
            to_chat({"model": "m", "input": "x", key: value})
        assert err.value.param == key
    with pytest.raises(InvalidRequest, match="input"):
        to_chat({"model": "m", "instructions": "x"})


def _ctx(names=None, **kw):
    body = {"model": "m", "tools": [FN, NS], "max_output_tokens": 9}
    _, n = convert_tools([FN, NS, {"type": "web_search"}])
    return ResponseContext(id="resp_" + "ab" * 16, created_at=1, body=body, names=names or n, **kw)


CHAT_USAGE = {
    "prompt_tokens": 50,
    "completion_tokens": 7,
    "total_tokens": 57,
    "prompt_tokens_details": {"cached_tokens": 32},
}


def test_from_chat_items_usage_and_namespace():
    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "mcp__github__search", "arguments": '{"q": "x"}'},
        },
        {"id": "call_2", "type": "custom", "custom": {"name": "apply_patch", "input": "*** Begin Patch"}},
    ]
    chat = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "Looking.", "tool_calls": calls},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": CHAT_USAGE,
        "cache": {"cached_tokens": 32, "type": None},
    }
    r = from_chat(_ctx(), chat)
    Response.model_validate(r)  # the SDK's own type accepts it
    assert [o["type"] for o in r["output"]] == ["message", "function_call", "custom_tool_call"]
    fc = r["output"][1]
    assert (fc["name"], fc["namespace"], fc["call_id"], fc["arguments"]) == (
        "search",
        "mcp__github__",
        "call_1",
        '{"q": "x"}',
    )
    assert r["output"][2]["input"] == "*** Begin Patch" and r["output"][2]["call_id"] == "call_2"
    assert r["usage"] == {
        "input_tokens": 50,
        "input_tokens_details": {"cached_tokens": 32, "cache_write_tokens": 18},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 57,
    }
    assert r["status"] == "completed" and r["max_output_tokens"] == 9
    assert r["agentserve"]["dropped_tools"] == [{"index": 2, "type": "web_search"}]


def test_length_cut_is_incomplete_and_the_cut_call_stays_out_of_the_text():
    cut = {"name": "read_file", "arguments_so_far": '{"pa'}
    chat = {
        "choices": [{"message": {"content": None}, "finish_reason": "length", "incomplete_tool_call": cut}]
    }
    r = from_chat(_ctx(), chat)
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["output"] == [] and r["agentserve"]["incomplete_tool_call"] == cut


def _chunk(delta=None, finish=None, **ext):
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"id": "x", "choices": [choice], **ext}


def _run(stream, chunks):
    async def gen():
        for c in chunks:
            yield c

    async def collect():
        return [ev async for ev in stream.events(gen())]

    return asyncio.run(collect())


def test_stream_events_are_sdk_types_in_order():
    chunks = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "Let"}),
        _chunk({"content": " me."}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "mcp__github__search", "arguments": '{"q"'},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "x"}'}}]}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "custom",
                        "custom": {"name": "apply_patch", "input": "*** Begin"},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 1, "type": "custom", "custom": {"input": " Patch"}}]}),
        _chunk(finish="tool_calls", cache={"cached_tokens": 0}),
        {"id": "x", "choices": [], "usage": CHAT_USAGE},
    ]
    stream = ResponsesStream(_ctx())
    events = _run(stream, chunks)
    parsed = [EVENT.validate_python(ev) for ev in events]
    assert [ev.sequence_number for ev in parsed] == list(range(len(events)))
    assert [ev.type for ev in parsed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert parsed[6].text == "Let me."
    assert parsed[12].arguments == '{"q": "x"}' and parsed[12].name == "search"
    assert parsed[17].input == "*** Begin Patch"
    final = parsed[-1].response
    assert final.usage.input_tokens_details.cached_tokens == 32
    assert [o.type for o in final.output] == ["message", "function_call", "custom_tool_call"]
    assert final.output[1].namespace == "mcp__github__"
    # the same reply, not streamed, gives the same items
    message = {
        "content": "Let me.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "mcp__github__search", "arguments": '{"q": "x"}'},
            },
            {"id": "call_2", "type": "custom", "custom": {"name": "apply_patch", "input": "*** Begin Patch"}},
        ],
    }
    whole = from_chat(
        _ctx(), {"choices": [{"message": message, "finish_reason": "tool_calls"}], "usage": CHAT_USAGE}
    )
    assert whole["output"] == stream.final["output"]


def test_stream_cut_is_incomplete_and_failure_is_response_failed():
    stream = ResponsesStream(_ctx())
    chunks = [_chunk({"content": "Hel"}), _chunk(finish="length", incomplete_tool_call=None)]
    events = _run(stream, chunks)
    assert EVENT.validate_python(events[-1]).type == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    failed = stream.failed_event(
        {"error": {"message": "boom", "type": "server_error", "code": "generation_failed"}}
    )
    ev = EVENT.validate_python(failed)
    assert ev.type == "response.failed" and ev.response.error.code == "server_error"
    assert ev.response.error.message == "generation_failed: boom"


def test_diagnostics_mapping():
    ctx = _ctx(compare_id="resp_a", compare_found=True)
    assert diagnostics(ctx, {"compared_with": "resp_a", "type": None}) == {"type": "cache_hit"}
    miss = diagnostics(
        ctx,
        {"compared_with": "resp_a", "type": "tools_changed", "missed_tokens": 40, "diverged_at_token": 12},
    )
    assert miss == {
        "type": "cache_miss",
        "reason": "tools_changed",
        "cache_missed_tokens": 40,
        "comparison_reusable_tokens": 12,
    }
    assert diagnostics(ctx, {"compared_with": "resp_a", "type": "evicted"}) == {"type": "unavailable"}
    assert diagnostics(_ctx(compare_id="resp_b"), {}) == {"type": "comparison_response_not_found"}
    assert diagnostics(_ctx(), {}) is None


def test_response_id_carries_the_session_placement_digest():
    from server.session_key import SessionKey, response_digest, response_id

    session = SessionKey("tenant\x00thread-1", "prompt_cache_key")
    rid = response_id(session)
    assert rid.startswith("resp_") and len(rid) == len("resp_") + 32
    assert response_digest(rid) == hashlib.sha256(b"tenant\x00thread-1").hexdigest()[:16] == session.placement
    assert response_id(session) != response_id(session)
    # a turn keyed only by previous_response_id keeps its session's placement in the next id
    follow = SessionKey("resp:" + session.placement, "previous_response_id", session.placement)
    assert response_digest(response_id(follow)) == session.placement
    assert response_digest("resp_short") is None and response_digest("chatcmpl-x") is None


def test_store_is_lru_by_count_and_bytes_per_tenant():
    def resp(i):
        return {"id": f"resp_{i}", "output": [{"type": "message", "content": "x" * 10}]}

    store = ResponseStore(max_responses=2, max_bytes=10_000)
    for i in range(3):
        store.put("a", [{"role": "user", "content": "q"}], resp(i))
    assert store.get("a", "resp_0") is None and store.get("a", "resp_2") is not None
    assert store.get("b", "resp_2") is None  # tenant-scoped
    assert store.get("a", "resp_1").items[-1] == resp(1)["output"][0]
    small = ResponseStore(max_responses=100, max_bytes=300)
    for i in range(5):
        small.put("a", [], resp(i))
    kept = [i for i in range(5) if small.get("a", f"resp_{i}")]
    assert kept and kept[-1] == 4 and len(kept) < 5
    assert not small.put("a", [{"content": "y" * 1000}], resp(9))
    assert small.delete("a", "resp_4") and not small.delete("a", "resp_4")
    assert json.dumps(store.get("a", "resp_2").response)
