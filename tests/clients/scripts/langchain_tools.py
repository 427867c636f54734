"""LangChain ChatOpenAI(...).bind_tools(...) against an agentserve URL; prints JSON.

Runs in its own venv (scripts/client_venvs.sh: langchain). Usage: langchain_tools.py URL
"""

from __future__ import annotations

import json
import sys

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return "7 C, rain"


def main(url: str) -> None:
    llm = ChatOpenAI(
        model="smollm2-135m-instruct",
        base_url=url + "/v1",
        api_key="unused",
        temperature=0,
        max_tokens=48,
        max_retries=0,
        timeout=300,
    )
    messages = [("system", "You are a weather assistant."), ("human", "Weather in Berlin?")]
    out = {}
    for name, choice in (("required", "required"), ("named", "get_weather")):
        msg = llm.bind_tools([get_weather], tool_choice=choice).invoke(messages)
        out[name] = {
            "tool_calls": msg.tool_calls,  # parsed by langchain: [{"name", "args", "id", "type"}]
            "invalid_tool_calls": msg.invalid_tool_calls,
            "content": msg.content,
            "finish_reason": msg.response_metadata.get("finish_reason"),
        }
    stream = None
    for chunk in llm.bind_tools([get_weather], tool_choice="required").stream(messages):
        stream = chunk if stream is None else stream + chunk
    out["stream"] = {"tool_calls": stream.tool_calls, "invalid_tool_calls": stream.invalid_tool_calls}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
