"""A fixed corpus of OpenAI-shaped conversations for the parity tests (no randomness at run time).

Every conversation ends with a user or tool message (a prompt for the next assistant turn).
Call ids are 9 letters/digits (Mistral's rule, harmless for the others). Everything is in the
order an SDK sends it (``{"type": "function", "function": {"name", "description",
"parameters"}}``, schemas ``{"type", "properties", "required"}`` or in another order, call
arguments with unsorted keys, \\u-escaped as Python's json.dumps writes them or UTF-8 as
JavaScript's JSON.stringify does): the parity tests give exactly this to both sides, nothing is
sorted on either.
"""

from __future__ import annotations

import json
from typing import Any

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "required": ["city"],
            "properties": {"unit": {"type": "string", "enum": ["c", "f"]}, "city": {"type": "string"}},
        },
    },
}
SHELL = {
    "type": "function",
    "function": {
        "name": "shell_exec",
        "description": "Run a shell command and return its output.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}
BROWSER = {
    "type": "function",
    "function": {
        "name": "browser_open",
        "description": "Open a URL; returns the page text (möglich: Umlaute).",
        "parameters": {
            "type": "object",
            "properties": {
                "url": {"type": "string"},
                "opts": {"type": "object", "properties": {"wait": {"type": "integer"}}},
            },
        },
    },
}
LIST_TABS = {  # a tool without parameters
    "type": "function",
    "function": {"name": "list_tabs", "description": "List the open browser tabs."},
}
TOOLSETS = [[WEATHER], [WEATHER, SHELL], [SHELL, BROWSER, WEATHER], [], [BROWSER, LIST_TABS, SHELL]]

_ARGS = [
    ("get_weather", {"unit": "c", "city": "Paris"}),
    ("shell_exec", {"cmd": "ls -la /tmp && echo 'done'"}),
    ("browser_open", {"url": "https://example.org/ü?q=1", "opts": {"wait": 3}}),
    ("get_weather", {"city": "Zürich"}),
    ("shell_exec", {"cmd": 'python -c "print(1)"'}),
    ("shell_exec", {"cmd": "printf 'a\\tb\\n' > x.txt\ncat x.txt  # \"quoted\" – ok"}),
    ("browser_open", {"opts": {"wait": 1}, "url": "https://例え.jp/パス"}),
]
_RESULTS = [
    '{"temp": 21, "sky": "clear"}',
    "total 0\ndone",
    "<html>Hallo Welt</html>",
    "22",
    "1",
    "".join(f"line {i}: ok — fine\n" for i in range(300)),  # a long result
    "a\tb\n",
]
_USER = [
    "What's the weather in Paris?",
    "List the files, then tell me.",
    "Ouvre la page et résume-la.",
    "Thanks! And Zürich?",
    "Run a quick python check.",
    "hi",
    "Explain what you did in two sentences.\nBe precise.",
]


def call_id(n: int) -> str:
    return f"c{n:08d}"


def _assistant_calls(
    k: int, n: int, counter: list[int], tools_named: set[str]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    calls, results = [], []
    for j in range(n):
        name, args = _ARGS[(k + j) % len(_ARGS)]
        if name not in tools_named:
            name, args = ("list_tabs", {}) if "list_tabs" in tools_named else _ARGS[0]
        counter[0] += 1
        cid = call_id(counter[0])
        calls.append(
            {
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=k % 2 == 0)},
            }
        )
        results.append({"role": "tool", "tool_call_id": cid, "content": _RESULTS[(k + j) % len(_RESULTS)]})
    return {"role": "assistant", "content": None, "tool_calls": calls}, results


def conversations() -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """40 conversations: (messages, tools)."""
    out = []
    for k in range(40):
        tools = TOOLSETS[k % len(TOOLSETS)]
        counter = [k * 10]
        msgs: list[dict[str, Any]] = []
        if k % 3 != 2:
            msgs.append(
                {
                    "role": "system",
                    "content": "You are a careful agent. Réponds brièvement." if k % 2 else "Be brief.",
                }
            )
        turns = 1 + k % 4
        for t in range(turns):
            msgs.append({"role": "user", "content": _USER[(k + t) % len(_USER)]})
            last = t == turns - 1
            if last and k % 2 == 0:
                break  # ends with the user message
            if tools and (k + t) % 3 != 1:
                n = 1 + (k + t) % 3  # one, two or three calls
                named = {tool["function"]["name"] for tool in tools}
                call, results = _assistant_calls(k + t, n, counter, named)
                msgs.append(call)
                msgs += results
                if last:
                    break  # ends with tool results
                msgs.append({"role": "assistant", "content": f"Done: step {t} finished."})
            elif not last:
                msgs.append({"role": "assistant", "content": f"Sure — answer {t}."})
        out.append((msgs, tools))
    return out
