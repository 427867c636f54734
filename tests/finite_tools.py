"""Tools with finite schemas (enums, no extra keys), shared by the reasoning tests over HTTP and on vLLM:
a random-weight model's call under them always ends, and every argument can be checked."""

from __future__ import annotations


def finite_tool(name: str, props: dict) -> dict:
    params = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": params}}


TOOLS = [
    finite_tool("shell_ls", {"path": {"type": "string", "enum": ["/", "/tmp"]}}),
    finite_tool("shell_exit", {"code": {"type": "integer", "enum": [0, 1]}}),
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
