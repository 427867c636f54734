"""OpenAI Agents SDK (openai-agents) tool loop against an agentserve URL; prints JSON.

Runs in its own venv (scripts/client_venvs.sh: agents). Usage: agents_loop.py URL [auto|required]
"auto" sends what the SDK sends by default (no tool_choice). Records every chat request the
SDK sent and the server's tool_state extension on each reply.
"""

from __future__ import annotations

import asyncio
import json
import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from openai.resources.chat.completions import AsyncCompletions

MODEL = "smollm2-135m-instruct"
RESULT = "7 C, rain"
calls: list[dict] = []
requests: list[dict] = []


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    calls.append({"city": city})
    return RESULT


_create = AsyncCompletions.create


async def recording_create(self, **kwargs):  # type: ignore[no-untyped-def]
    reply = await _create(self, **kwargs)
    sent = {k: v for k, v in kwargs.items() if k in ("tool_choice", "messages")}
    sent["tool_choice"] = kwargs.get("tool_choice")  # the SDK passes openai's NOT_GIVEN/omit when unset
    sent["tool_choice_sent"] = isinstance(sent["tool_choice"], (str, dict))
    if not sent["tool_choice_sent"]:
        sent["tool_choice"] = None
    sent["tool_state"] = (getattr(reply, "model_extra", None) or {}).get("tool_state")
    requests.append(json.loads(json.dumps(sent, default=str)))
    return reply


AsyncCompletions.create = recording_create  # type: ignore[method-assign]


async def main(url: str, mode: str) -> None:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    settings = ModelSettings(temperature=0, max_tokens=48)
    if mode == "required":
        settings = ModelSettings(temperature=0, max_tokens=48, tool_choice="required")
    agent = Agent(
        name="weather",
        instructions="You are a weather assistant. Call get_weather for each city asked about.",
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        model_settings=settings,
        tools=[get_weather],
    )
    result = await Runner.run(agent, "Weather in Berlin?", max_turns=4)
    print(json.dumps({"final_output": result.final_output, "calls": calls, "requests": requests}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "auto"))
