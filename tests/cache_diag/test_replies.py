"""The previous reply as returned vs as sent back: the parts and their first difference."""

from __future__ import annotations

from server.cache_diag.replies import first_difference
from server.chat.returned import message_parts, returned_reply, sent_back

CALL = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path":"a.py"}'}}


def test_the_same_reply_and_re_serialized_arguments_are_no_difference():
    returned = message_parts({"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]})
    spaced = dict(CALL, function={"name": "read", "arguments": '{"path": "a.py"}'})
    echoed = message_parts({"role": "assistant", "content": "Let me look.", "tool_calls": [spaced]})
    assert first_difference(returned, echoed) is None


def test_edited_content_arguments_and_dropped_calls_are_located():
    returned = message_parts({"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]})
    edited = message_parts({"role": "assistant", "content": "Let me see.", "tool_calls": [CALL]})
    assert first_difference(returned, edited) == ("content", 7)
    other = dict(CALL, function={"name": "read", "arguments": '{"path":"b.py"}'})
    args = message_parts({"role": "assistant", "content": "Let me look.", "tool_calls": [other]})
    assert first_difference(returned, args) == ("tool_calls[0].arguments", 9)
    dropped = message_parts({"role": "assistant", "content": "Let me look."})
    assert first_difference(returned, dropped) == ("tool_calls[0].name", 0)
    reordered = message_parts({"role": "assistant", "content": "Let me look.", "tool_calls": [CALL, CALL]})
    assert first_difference(returned, reordered) == ("tool_calls[1].name", 0)


def test_a_reply_left_out_is_an_empty_reply():
    messages = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]
    assert sent_back(messages, 1) == () and sent_back(messages, 5) == ()
    assert first_difference((), sent_back(messages, 1)) is None
    assert first_difference((("content", "x"),), ()) == ("content", 0)


def test_the_server_cut_a_call_or_a_stop_string():
    choice = {"message": {"role": "assistant", "content": ""}, "incomplete_tool_call": {"name": "read"}}
    assert returned_reply({"choices": [choice]}) == ((), True)
    stopped = {"message": {"role": "assistant", "content": "ok"}, "stop_reason": "END"}
    assert returned_reply({"choices": [stopped]}) == ((("content", "ok"),), True)
    plain = {"message": {"role": "assistant", "content": "ok", "reasoning_content": "think"}}
    assert returned_reply({"choices": [plain]}) == ((("reasoning", "think"), ("content", "ok")), False)
