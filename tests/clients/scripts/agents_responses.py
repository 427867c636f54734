"""The OpenAI Agents SDK's default path against an agentserve URL; prints JSON.

Runs in its own venv (scripts/client_venvs.sh: agents). Usage: agents_responses.py URL
What a new user writes first: ``Agent(model=NAME)`` with a default client, so the SDK's default
model class (``OpenAIResponsesModel``: ``POST /v1/responses``) and default ``ModelSettings`` (no
``max_output_tokens``, no ``tool_choice``). Records what each request sent and how it ended; the
SDK raises ``ModelBehaviorError`` on a ``response.incomplete`` (the script then exits 1).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI
from openai.resources.responses import AsyncResponses

MODEL = "smollm2-135m-instruct"
requests: list[dict] = []
calls: list[dict] = []


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    calls.append({"city": city})
    return "7 C, rain"


_create = AsyncResponses.create


async def recording_create(self, **kwargs):  # type: ignore[no-untyped-def]
    sent = {
        k: kwargs[k] for k in ("max_output_tokens", "tool_choice") if isinstance(kwargs.get(k), int | str)
    }
    entry: dict = {"sent": sent, "stream": bool(kwargs.get("stream"))}
    requests.append(entry)
    reply = await _create(self, **kwargs)
    if not entry["stream"]:
        entry.update(status=reply.status, output_tokens=reply.usage.output_tokens if reply.usage else None)
    return reply


AsyncResponses.create = recording_create  # type: ignore[method-assign]


async def main(url: str) -> None:
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=900))
    agent = Agent(
        name="weather",
        instructions="You are a weather assistant. Call get_weather for each city asked about.",
        model=MODEL,
        tools=[get_weather],
    )
    start = time.monotonic()
    result = await Runner.run(agent, "Weather in Berlin?")
    print(
        json.dumps(
            {
                "final_output": result.final_output,
                "calls": calls,
                "requests": requests,
                "seconds": round(time.monotonic() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
