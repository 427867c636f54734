"""The openai client's streaming tool-call accumulation vs the same request not streamed; prints JSON.

Runs in any venv with openai (1.x in scripts/client_venvs.sh: openai1; 3.x in the main venv).
Usage: openai_stream.py URL. Two accumulations of the stream: the client's own
ChatCompletionStreamState (what its .stream() helper uses) and the by-index merge clients write.
"""

from __future__ import annotations

import json
import sys

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

MODEL = "smollm2-135m-instruct"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]
MESSAGES = [
    {"role": "system", "content": "You are a weather assistant. Call the tools for each city asked about."},
    {"role": "user", "content": "Weather and time in Berlin and in Paris?"},
]


def calls(tool_calls) -> list[dict]:  # type: ignore[no-untyped-def]
    return [
        {"index": i, "id": c.id, "type": c.type, "name": c.function.name, "arguments": c.function.arguments}
        for i, c in enumerate(tool_calls or [])
    ]


def main(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    body = dict(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=120
    )
    plain = client.chat.completions.create(**body)
    state = ChatCompletionStreamState()
    by_index: dict[int, dict] = {}
    deltas_per_call: dict[int, int] = {}
    for chunk in client.chat.completions.create(stream=True, **body):
        state.handle_chunk(chunk)
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                acc = by_index.setdefault(d.index, {"id": None, "type": None, "name": "", "arguments": ""})
                deltas_per_call[d.index] = deltas_per_call.get(d.index, 0) + 1
                acc["id"] = acc["id"] or d.id
                acc["type"] = acc["type"] or d.type
                if d.function:
                    acc["name"] += d.function.name or ""
                    acc["arguments"] += d.function.arguments or ""
    final = state.get_final_completion()
    print(
        json.dumps(
            {
                "openai_version": openai.__version__,
                "plain": {
                    "finish_reason": plain.choices[0].finish_reason,
                    "calls": calls(plain.choices[0].message.tool_calls),
                    "content": plain.choices[0].message.content,
                },
                "stream_state": {
                    "finish_reason": final.choices[0].finish_reason,
                    "calls": calls(final.choices[0].message.tool_calls),
                    "content": final.choices[0].message.content,
                },
                "stream_by_index": [{"index": i, **by_index[i]} for i in sorted(by_index)],
                "deltas_per_call": [deltas_per_call[i] for i in sorted(deltas_per_call)],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
