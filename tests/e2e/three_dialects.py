"""One conversation in each dialect (Chat Completions, Anthropic Messages, Responses) as raw JSON:
the request body, the reply to send back, the number of calls. Shared by the e2e tests of what the
server does for a session's cache (kept tools, the causes of a miss inside a reply)."""

from __future__ import annotations

from typing import Any

import httpx

MODEL = "smollm2-135m-instruct"
SCHEMA = {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}


def post(url: str, path: str, body: dict[str, Any], session: str | None) -> dict[str, Any]:
    headers = {"x-session-id": session} if session else {}
    r = httpx.post(url + path, json={"model": MODEL, **body}, headers=headers, timeout=300)
    assert r.status_code == 200, r.text
    return dict(r.json())


class Chat:
    path = "/v1/chat/completions"

    @staticmethod
    def tools(names: tuple[str, ...], schema: dict[str, Any] = SCHEMA) -> list[dict[str, Any]]:
        return [
            {"type": "function", "function": {"name": n, "description": n, "parameters": schema}}
            for n in names
        ]

    @classmethod
    def body(
        cls, system: str, history: list[dict[str, Any]], tools: list[dict[str, Any]] | None, n: int = 4
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": [{"role": "system", "content": system}, *history],
            "max_tokens": n,
            "temperature": 0,
        }
        if tools is not None:
            body["tools"] = tools
        return body

    @staticmethod
    def required() -> dict[str, Any]:
        return {"tool_choice": "required"}

    @staticmethod
    def replies(r: dict[str, Any], text: str | None = None) -> list[dict[str, Any]]:
        """The reply as returned (``text``: its text replaced, as a client that edits it)."""
        message = r["choices"][0]["message"]
        out = {"role": "assistant", "content": message["content"] if text is None else text}
        if message.get("tool_calls"):
            out["tool_calls"] = message["tool_calls"]
        return [out]

    @staticmethod
    def calls(r: dict[str, Any]) -> int:
        return len(r["choices"][0]["message"].get("tool_calls") or [])

    @staticmethod
    def text(r: dict[str, Any]) -> str:
        return str(r["choices"][0]["message"]["content"] or "")


class Messages:
    path = "/v1/messages"

    @staticmethod
    def tools(names: tuple[str, ...], schema: dict[str, Any] = SCHEMA) -> list[dict[str, Any]]:
        return [{"name": n, "description": n, "input_schema": schema} for n in names]

    @classmethod
    def body(
        cls, system: str, history: list[dict[str, Any]], tools: list[dict[str, Any]] | None, n: int = 4
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"system": system, "messages": history, "max_tokens": n, "temperature": 0}
        if tools is not None:
            body["tools"] = tools
        return body

    @staticmethod
    def required() -> dict[str, Any]:
        return {"tool_choice": {"type": "any"}}

    @staticmethod
    def replies(r: dict[str, Any], text: str | None = None) -> list[dict[str, Any]]:
        blocks = r["content"]
        if text is not None:
            blocks = [{"type": "text", "text": text} if b["type"] == "text" else b for b in blocks]
        return [{"role": "assistant", "content": blocks}] if blocks else []  # Anthropic: no empty turn

    @staticmethod
    def calls(r: dict[str, Any]) -> int:
        return sum(1 for b in r["content"] if b["type"] == "tool_use")

    @staticmethod
    def text(r: dict[str, Any]) -> str:
        return "".join(b["text"] for b in r["content"] if b["type"] == "text")


class Responses:
    path = "/v1/responses"

    @staticmethod
    def tools(names: tuple[str, ...], schema: dict[str, Any] = SCHEMA) -> list[dict[str, Any]]:
        return [{"type": "function", "name": n, "description": n, "parameters": schema} for n in names]

    @classmethod
    def body(
        cls, system: str, history: list[dict[str, Any]], tools: list[dict[str, Any]] | None, n: int = 4
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "instructions": system,
            "input": history,
            "max_output_tokens": n,
            "temperature": 0,
            "store": False,
        }
        if tools is not None:
            body["tools"] = tools
        return body

    @staticmethod
    def required() -> dict[str, Any]:
        return {"tool_choice": "required"}

    @staticmethod
    def replies(r: dict[str, Any], text: str | None = None) -> list[dict[str, Any]]:
        """The output items sent back as input (as Codex does), without their ids and statuses."""
        out = []
        for item in r["output"]:
            item = {k: v for k, v in item.items() if k not in ("id", "status")}
            if item["type"] == "message" and text is not None:
                item["content"] = [{"type": "output_text", "text": text}]
            out.append(item)
        return out

    @staticmethod
    def calls(r: dict[str, Any]) -> int:
        return sum(1 for item in r["output"] if item["type"] == "function_call")

    @staticmethod
    def text(r: dict[str, Any]) -> str:
        parts = [p for item in r["output"] if item["type"] == "message" for p in item["content"]]
        return "".join(p["text"] for p in parts)


DIALECTS = [Chat, Messages, Responses]
