"""A plain OpenAI client (tools, no tool_choice) gets OpenAI's "auto" on a new user message.

Fails on the old default (grammars/agent.yaml answered every new user message in text: mode
"none", no tool allowed), which broke every client that leaves tool_choice out.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The current time", "parameters": {"type": "object"}},
}
TOOLS = [WEATHER, TIME]
# one earlier turn in which the assistant called the tool: a new user message then asks again
HISTORY = [
    {"role": "system", "content": "You are a weather assistant. Call get_weather for each city asked about."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "assistant", "content": "It is 18 C and sunny in Paris."},
]


def test_no_tool_choice_on_a_new_user_message_is_auto_over_all_tools(client):
    msgs = [*HISTORY, {"role": "user", "content": "Weather in Berlin?"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, temperature=0, max_tokens=48)
    state = r.model_extra["tool_state"]
    assert state["mode"] == "auto" and state["allowed"] == ["get_weather", "get_time"], state


def test_a_client_loop_sends_the_tool_result_back_and_finishes(client):
    """The loop an OpenAI client runs: call → run the tool → send the result → final text.

    The first turn asks for a call (the 135M test model seldom calls under "auto"); the turns
    after it leave tool_choice out, as clients do, and the default machine must let the run end.
    """
    msgs = [*HISTORY, {"role": "user", "content": "Weather in Berlin?"}]
    choice: str | None = "required"
    turns = 0
    for _ in range(4):
        turns += 1
        extra = {"tool_choice": choice} if choice else {}
        r = client.chat.completions.create(
            model=MODEL, messages=msgs, tools=TOOLS, temperature=0, max_tokens=48, **extra
        )
        message = r.choices[0].message
        if not message.tool_calls:
            break
        msgs.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            json.loads(call.function.arguments)
            msgs.append({"role": "tool", "tool_call_id": call.id, "content": "7 C, rain"})
        choice = None
    assert turns >= 2 and msgs[-1]["role"] == "tool" and not message.tool_calls, msgs[-2:]
