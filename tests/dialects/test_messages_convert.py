"""Anthropic Messages -> chat conversion, ids, errors, stream events: no model needed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from server.dialects.messages import ids
from server.dialects.messages.error_shape import shape_error, stream_error_event
from server.dialects.messages.request import MessagesBody, convert
from server.dialects.messages.response import Reply, cache_miss_reason, stop_reason
from server.dialects.messages.stream import message_events
from server.errors import InvalidRequest, Overloaded, PayloadTooLarge, Unauthorized
from server.session_key import session_key

MODEL = "m"
BILLING = "x-anthropic-billing-header: cc_version=2.1.328.a1b; cc_entrypoint=sdk-cli; cch={};"
TOOL = {
    "name": "Glob",
    "description": "Find files",
    "input_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"pattern": {"type": "string"}},
        "required": ["pattern"],
        "additionalProperties": False,
    },
    "cache_control": {"type": "ephemeral"},
}


def conv(**body):
    body = {"model": MODEL, "max_tokens": 16, **body}
    return convert(MessagesBody.model_validate(body), body)


def chat_messages(c):
    return [m.model_dump(exclude_none=True) for m in c.chat.messages]


def claude_code_turn(billing_hash: str, env_as_list: bool, more: list | None = None):
    """A Claude Code-like body: three system blocks, an environment system message after the first
    user message (a one-block list on turn 1, a string on turn 2), cache_control on the newest block."""
    env = "<env>cwd: /repo</env>"
    system = [
        {"type": "text", "text": BILLING.format(billing_hash)},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be careful.", "cache_control": {"type": "ephemeral"}},
    ]
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "List files", "cache_control": {"type": "ephemeral"}}],
        },
        {"role": "system", "content": [{"type": "text", "text": env}] if env_as_list else env},
        *(more or []),
    ]
    return conv(system=system, messages=messages, tools=[TOOL], metadata={"user_id": '{"session_id": "s1"}'})


def test_string_and_one_text_block_render_alike_and_cache_control_is_ignored():
    a = conv(system="Be brief.", messages=[{"role": "user", "content": "hi"}])
    b = conv(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
            }
        ],
    )
    assert (
        chat_messages(a)
        == chat_messages(b)
        == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ]
    )


def test_billing_header_is_not_rendered_and_does_not_move_the_session():
    one, two = claude_code_turn("aaaaa", True), claude_code_turn("bbbbb", True)
    assert chat_messages(one) == chat_messages(two)
    assert chat_messages(one)[0] == {"role": "system", "content": "You are Claude Code.\nBe careful."}
    assert "x-anthropic-billing-header" not in str(one.raw)
    # without a session id the prefix hash is the key: the changing header must not change it
    assert session_key(one.raw, {}).key == session_key(two.raw, {}).key
    assert one.raw["metadata"] == {"user_id": '{"session_id": "s1"}'}  # kept for the session key
    assert list(one.raw)[:3] == ["model", "max_tokens", "messages"]  # the client's key order


def test_claude_code_turn_two_is_append_only():
    turn1 = chat_messages(claude_code_turn("aaaaa", env_as_list=True))
    more = [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "let me look", "signature": "sig"},
                {"type": "tool_use", "id": "toolu_call_x_0", "name": "Glob", "input": {"pattern": "*"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_call_x_0",
                    "content": [{"type": "text", "text": "a.py"}],
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]
    turn2 = chat_messages(claude_code_turn("bbbbb", env_as_list=False, more=more))
    assert turn2[: len(turn1)] == turn1
    assert turn2[len(turn1) :] == [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_x_0",
                    "type": "function",
                    "function": {"name": "Glob", "arguments": '{"pattern": "*"}'},
                }
            ],
            "reasoning_content": "let me look",  # a thinking block: the turn's reasoning
        },
        {"role": "tool", "content": "a.py", "tool_call_id": "call_x_0"},
    ]


def test_tools_server_tools_and_tool_choice():
    web = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
    c = conv(
        messages=[{"role": "user", "content": "x"}],
        tools=[TOOL, web, {"type": "bash_20250124", "name": "bash"}],
        tool_choice={"type": "tool", "name": "Glob", "disable_parallel_tool_use": True},
    )
    assert [t.function.name for t in c.chat.tools] == ["Glob"]
    assert c.chat.tools[0].function.parameters == TOOL["input_schema"]
    assert c.dropped_tools == ["web_search (web_search_20250305)", "bash (bash_20250124)"]
    assert c.chat.tool_choice.function.name == "Glob" and c.chat.parallel_tool_calls is False
    for choice, chat in (
        ({"type": "any"}, "required"),
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
    ):
        got = conv(messages=[{"role": "user", "content": "x"}], tools=[TOOL], tool_choice=choice).chat
        assert got.tool_choice == chat and got.parallel_tool_calls is True
    assert conv(messages=[{"role": "user", "content": "x"}], tools=[TOOL]).chat.tool_choice is None


def test_fields_accepted_or_used():
    c = conv(
        messages=[{"role": "user", "content": "x"}],
        stop_sequences=["END"],
        temperature=0.5,
        top_k=5,
        thinking={"type": "adaptive"},
        output_config={"effort": "high"},
        context_management={"edits": []},
        service_tier="auto",
        diagnostics={"previous_message_id": "msg_abc"},
        tool_state_machine="off",
        stream=True,
    )
    assert c.chat.stop == ["END"] and c.chat.temperature == 0.5 and c.chat.top_k == 5
    assert c.chat.stream and c.chat.stream_options.include_usage
    assert c.chat.cache_compare_with == "chatcmpl-abc" and c.diagnostics
    assert c.chat.tool_state_machine == "off"


@pytest.mark.parametrize(
    "messages, needle",
    [
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}],
                }
            ],
            "no tool_use",
        ),
        ([{"role": "user", "content": [{"type": "image", "source": {}}]}], "image blocks are not supported"),
        ([{"role": "user", "content": [{"type": "video"}]}], "block type 'video' is not supported"),
        ([{"role": "user", "content": [{"text": "no type"}]}], 'object with a "type"'),
        ([{"role": "user", "content": [{"type": "text"}]}], 'needs a string "text"'),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "prefilling"),
        ([{"role": "tool", "content": "x"}], "role 'tool' is not supported"),
        (
            [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_1", "name": "Glob", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "t"},
                        {"type": "tool_result", "tool_use_id": "toolu_1"},
                    ],
                },
            ],
            "must come first",
        ),
        (
            [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "G", "input": []}]}],
            "must be a JSON object",
        ),
    ],
)
def test_bad_blocks_are_400s_that_say_what_and_how(messages, needle):
    with pytest.raises(InvalidRequest) as exc:
        conv(messages=messages)
    assert needle in exc.value.message and exc.value.message.startswith("messages[")


def test_bad_top_level_fields():
    with pytest.raises(InvalidRequest, match="thinking.type"):
        conv(messages=[{"role": "user", "content": "x"}], thinking={"type": "sometimes"})
    with pytest.raises(InvalidRequest, match="tool_choice"):
        conv(messages=[{"role": "user", "content": "x"}], tools=[TOOL], tool_choice={"type": "some"})
    with pytest.raises(InvalidRequest, match="needs tools"):
        conv(messages=[{"role": "user", "content": "x"}], tool_choice={"type": "any"})


def test_history_blocks_documents_and_tool_result_text():
    c = conv(
        messages=[
            {"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "DOC"}}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "ok"},
                    {"type": "tool_use", "id": "toolu_q", "name": "Glob", "input": {"pattern": "a"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_q", "is_error": True, "content": "boom"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_q",
                        "content": [{"type": "tool_reference", "tool_name": "Glob"}],
                    },
                    {"type": "text", "text": "go on"},
                ],
            },
        ]
    )
    got = chat_messages(c)
    assert got[0] == {"role": "user", "content": "DOC"}
    assert got[1]["content"] == "ok" and got[1]["tool_calls"][0]["id"] == "q"
    assert got[2:] == [
        {"role": "tool", "content": "boom", "tool_call_id": "q"},
        {"role": "tool", "content": '{"tool_name": "Glob", "type": "tool_reference"}', "tool_call_id": "q"},
        {"role": "user", "content": "go on"},
    ]


def test_ids_round_trip():
    assert ids.message_id("chatcmpl-abc") == "msg_abc" and ids.chat_id("msg_abc") == "chatcmpl-abc"
    assert ids.call_id(ids.tool_use_id("a1B2c3D4e")) == "a1B2c3D4e"  # Mistral's 9-character ids survive
    assert ids.chat_id("other") == "other"


def test_errors_take_anthropic_shape_on_messages_paths_only():
    for exc, kind in (
        (InvalidRequest("bad"), "invalid_request_error"),
        (Unauthorized("no key"), "authentication_error"),
        (PayloadTooLarge("big"), "request_too_large"),
        (Overloaded("busy"), "rate_limit_error"),
    ):
        body = shape_error("/v1/messages", exc.status, exc.body())
        assert body == {"type": "error", "error": {"type": kind, "message": exc.message}}
        assert stream_error_event(exc.body())["error"]["type"] == kind
    assert shape_error("/v1/messages/count_tokens", 500, {})["error"]["type"] == "api_error"
    assert shape_error("/v1/chat/completions", 400, {"error": {"message": "x"}}) == {
        "error": {"message": "x"}
    }
    assert shape_error("/v1/messagesX", 400, {"error": {}}) == {"error": {}}


def test_cache_miss_reason_in_anthropic_types():
    cid = "chatcmpl-1"
    assert cache_miss_reason({"type": "system_changed", "missed_tokens": 7}, cid) == {
        "type": "system_changed",
        "cache_missed_input_tokens": 7,
    }
    assert (
        cache_miss_reason({"type": "template_rewrote_history", "missed_tokens": 2}, cid)["type"]
        == "messages_changed"
    )
    assert cache_miss_reason({"type": "unavailable", "compared_with": cid}, cid) == {
        "type": "previous_message_not_found"
    }
    assert cache_miss_reason({"type": "settings_changed", "missed_tokens": 2}, cid) == {"type": "unavailable"}
    for kind in (None, "evicted", "expired"):  # not a change of the request
        assert cache_miss_reason({"type": kind, "missed_tokens": 3}, cid) is None
    assert cache_miss_reason({"type": "system_changed"}, None) is None  # no previous_message_id


def prepared(max_tokens=10):
    return SimpleNamespace(
        request_id="chatcmpl-xyz", prompt_ids=[1] * 12, sampling=SimpleNamespace(max_tokens=max_tokens)
    )


def test_stop_reasons():
    reply = Reply(MODEL, 10)
    assert stop_reason(prepared(), reply, "tool_calls", None) == ("tool_use", None)
    assert stop_reason(prepared(), reply, "length", None) == ("max_tokens", None)
    assert stop_reason(prepared(4), reply, "length", None) == ("model_context_window_exceeded", None)
    assert stop_reason(prepared(), reply, "stop", "END") == ("stop_sequence", "END")
    assert stop_reason(prepared(), reply, "stop", None) == ("end_turn", None)


def test_stream_events_from_chat_chunks():
    call = {"id": "call_1", "type": "function", "function": {"name": "Glob", "arguments": '{"pattern": "*"}'}}
    usage = {"prompt_tokens": 12, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 8}}
    cache = {"cached_tokens": 8, "type": None}
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"content": "Look"}}]},
        {"choices": [{"delta": {"content": "ing"}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, **call}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}], "cache": cache},
        {"choices": [], "usage": usage, "cache": cache},
    ]

    async def gen():
        for c in chunks:
            yield c

    async def collect():
        return [e async for e in message_events(prepared(), Reply(MODEL, 10, diagnostics=True), gen())]

    events = asyncio.run(collect())
    assert [e["type"] for e in events] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    assert events[0]["message"]["id"] == "msg_xyz" and events[0]["message"]["usage"]["input_tokens"] == 12
    assert events[6]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_call_1",
        "name": "Glob",
        "input": {},
    }
    assert events[7]["delta"] == {"type": "input_json_delta", "partial_json": '{"pattern": "*"}'}
    delta = events[9]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {
        "input_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 8,
        "output_tokens": 5,
    }
    assert delta["cache"] == cache and delta["diagnostics"] == {"cache_miss_reason": None}


def test_closing_the_event_stream_closes_the_chat_stream():
    closed = []

    async def chat():
        try:
            while True:
                yield {"choices": [{"delta": {"content": "x"}}]}
        finally:
            closed.append(True)  # service.stream's finally cancels the engine request

    async def run():
        events = message_events(prepared(), Reply(MODEL, 10), chat())
        assert [(await anext(events))["type"] for _ in range(4)][-1] == "content_block_delta"
        await events.aclose()
        assert closed == [True]  # now, not when the event loop shuts down

    asyncio.run(run())
