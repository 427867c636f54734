"""A chat completion → a Responses ``response`` object (output items, status, usage, cache).

Response ids are ``resp_`` + the first 16 hex digits of sha256(the session key: the
tenant-namespaced key the router places sessions by, ``Prepared.session.key``) + 16 random
hex digits, so a router can send a request carrying ``previous_response_id`` (and no
``prompt_cache_key``) to the worker holding that session from the id alone. The id is also the
id the cache reporter keeps the prompt under, so ``prompt_cache_options.comparison_response_id``
takes Responses ids. Item ids derive from the response id (``msg_…``, ``fc_…_N``, ``ctc_…_N``).

Extensions next to OpenAI's fields: ``cache`` (as in chat: cached tokens, where and why the
session's prefix diverged, the fix), ``tool_state``, and ``agentserve`` (``dropped_tools``: the
hosted tools this server cannot run; ``incomplete_tool_call``: a call cut by max_output_tokens,
kept out of the text; ``finish_reason``: the chat finish reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from server.dialects.responses.tools import ToolNames
from server.log_budget import cut

PREFIX = "resp_"
ECHO_DEFAULTS: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "prompt_cache_key": None,
    "prompt_cache_retention": None,
    "reasoning": None,
    "store": True,
    "temperature": 1.0,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "truncation": "disabled",
    "user": None,
}
# chat finish reasons that make a response incomplete → its incomplete_details.reason
INCOMPLETE_REASONS = {"length": "max_output_tokens", "interrupted": "interrupted"}
# our cache report's miss types → OpenAI's prompt_cache_diagnostics reasons
MISS_REASONS = {
    "model_changed": "model_changed",
    "tools_changed": "tools_changed",
    "system_changed": "input_changed",
    "messages_changed": "input_changed",
    "template_rewrote_history": "input_changed",
    "reply_changed": "input_changed",
    "reply_cut": "input_changed",
    "settings_changed": "input_changed",
}


def item_id(kind: str, response_id: str, index: int | None = None) -> str:
    base = response_id[len(PREFIX) :]
    return f"{kind}_{base}" if index is None else f"{kind}_{base}_{index}"


@dataclass
class ResponseContext:
    """What the response side needs from the request."""

    id: str
    created_at: int
    body: dict[str, Any]
    names: ToolNames = field(default_factory=ToolNames)
    compare_id: str | None = None  # prompt_cache_options.comparison_response_id
    compare_found: bool = False

    def echo(self) -> dict[str, Any]:
        """The request's fields echoed in the response, as far as they are used: hosted tools (dropped,
        never rendered) by their type, ``reasoning`` and ``text`` by their known keys."""
        out = {k: self.body.get(k, default) for k, default in ECHO_DEFAULTS.items()}
        if isinstance(out["tools"], list):
            out["tools"] = [_echo_tool(t) for t in out["tools"]]
        for key, known in ECHO_KEYS.items():
            if isinstance(out[key], dict):
                out[key] = {k: v for k, v in out[key].items() if k in known}
        return out


RENDERED_TOOLS = ("function", "custom", "namespace")
ECHO_KEYS = {"reasoning": ("effort", "summary", "generate_summary"), "text": ("format", "verbosity")}


def _echo_tool(tool: Any) -> Any:
    if isinstance(tool, dict) and tool.get("type") not in RENDERED_TOOLS:
        return {"type": cut(tool.get("type"))}
    return tool


def message_item(rid: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    content = [part] if status == "completed" else []
    return {
        "id": item_id("msg", rid),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def reasoning_item(rid: str, text: str, status: str = "completed") -> dict[str, Any]:
    """A reasoning family's reasoning: the text itself as ``reasoning_text`` content (no summary is
    made; nothing is encrypted). Sent back in ``input``, it renders as the turn's reasoning."""
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {
        "id": item_id("rs", rid),
        "type": "reasoning",
        "status": status,
        "summary": [],
        "content": content,
    }


def call_item(
    rid: str, index: int, call: dict[str, Any], names: ToolNames, status: str = "completed"
) -> dict[str, Any]:
    """A chat ``tool_calls`` entry → a ``function_call`` or ``custom_tool_call`` item."""
    if call.get("type") == "custom":
        body = call.get("custom") or {}
        name, ns = names.item_name(body.get("name", ""))
        item = {"id": item_id("ctc", rid, index), "type": "custom_tool_call", "status": status}
        item |= {"call_id": call.get("id", ""), "name": name, "input": body.get("input", "")}
    else:
        fn = call.get("function") or {}
        name, ns = names.item_name(fn.get("name", ""))
        item = {"id": item_id("fc", rid, index), "type": "function_call", "status": status}
        item |= {"call_id": call.get("id", ""), "name": name, "arguments": fn.get("arguments", "")}
    if ns is not None:
        item["namespace"] = ns
    return item


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not chat_usage:
        return None
    details = chat_usage.get("prompt_tokens_details") or {}
    prompt, cached = chat_usage.get("prompt_tokens", 0), details.get("cached_tokens", 0)
    reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    return {
        "input_tokens": prompt,
        # cache_write_tokens: the tokens prefilled now, which the prefix cache keeps (full blocks)
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": prompt - cached},
        "output_tokens": chat_usage.get("completion_tokens", 0),
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": chat_usage.get("total_tokens", 0),
    }


def diagnostics(ctx: ResponseContext, cache: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI's ``prompt_cache_diagnostics`` from our cache report (only when a comparison was asked)."""
    if ctx.compare_id is None:
        return None
    if not ctx.compare_found:
        return {"type": "comparison_response_not_found"}
    if not cache or cache.get("compared_with") != ctx.compare_id:
        return {"type": "unavailable"}
    kind = cache.get("type")
    if not kind:
        return {"type": "cache_hit"}
    reason = MISS_REASONS.get(kind)
    if reason is None:  # evicted / expired / unavailable: the `cache` extension says which
        return {"type": "unavailable"}
    out: dict[str, Any] = {
        "type": "cache_miss",
        "reason": reason,
        "cache_missed_tokens": cache.get("missed_tokens", 0),
    }
    if cache.get("diverged_at_token") is not None:
        out["comparison_reusable_tokens"] = cache["diverged_at_token"]
    return out


def response_object(
    ctx: ResponseContext,
    status: str,
    output: list[dict[str, Any]],
    chat: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    finish: str | None = None,
    cut: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``response`` object; ``chat``: the chat completion (or final chunk + usage) it came from."""
    chat = chat or {}
    obj: dict[str, Any] = {
        "id": ctx.id,
        "object": "response",
        "created_at": ctx.created_at,
        "status": status,
        "error": error,
        "incomplete_details": {"reason": INCOMPLETE_REASONS.get(finish or "", "max_output_tokens")}
        if status == "incomplete"
        else None,
        "model": ctx.body.get("model"),
        "output": output,
        **ctx.echo(),
        "usage": usage(chat.get("usage")),
    }
    if ctx.compare_id is not None:
        obj["prompt_cache_options"] = {"comparison_response_id": ctx.compare_id}
        obj["prompt_cache_diagnostics"] = diagnostics(ctx, chat.get("cache"))
    for ext in ("cache", "tool_state", "max_tokens_clamped"):  # max_output_tokens lowered to fit the window
        if chat.get(ext) is not None:
            obj[ext] = chat[ext]
    agentserve: dict[str, Any] = {"dropped_tools": ctx.names.dropped}
    if finish is not None:
        agentserve["finish_reason"] = finish
    if cut is not None:
        agentserve["incomplete_tool_call"] = cut
    obj["agentserve"] = agentserve
    return obj


def status_of(finish: str | None) -> str:
    return "incomplete" if finish in INCOMPLETE_REASONS else "completed"


def from_chat(ctx: ResponseContext, chat: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed chat completion → the ``response`` object."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        output.append(reasoning_item(ctx.id, message["reasoning_content"]))
    if message.get("content"):
        output.append(message_item(ctx.id, message["content"]))
    for i, call in enumerate(message.get("tool_calls") or []):
        output.append(call_item(ctx.id, i, call, ctx.names))
    finish = choice.get("finish_reason")
    return response_object(
        ctx, status_of(finish), output, chat, finish=finish, cut=choice.get("incomplete_tool_call")
    )
