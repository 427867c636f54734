"""The previous reply as the server returned it, and as the client sent it back, in comparable parts.

The cache report (``server/cache_diag/replies.py``) names a miss inside the previous reply by who
changed it: the client sent back other content than the server returned (``reply_changed``), the
server itself dropped part of what the model wrote (``reply_cut``: a call cut by ``max_tokens``, a
stop string), or neither (the template rewrote the reply: ``template_rewrote_history``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from server.cache_diag.replies import Parts


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, Mapping))
    return ""


def message_parts(message: Mapping[str, Any] | None) -> Parts:
    """An assistant message (chat form: as returned, or as sent back) → its parts; None → ()."""
    if message is None:
        return ()
    parts: list[tuple[str, str]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    if reasoning:
        parts.append(("reasoning", str(reasoning)))
    content = _text(message.get("content"))
    if content:
        parts.append(("content", content))
    for i, call in enumerate(message.get("tool_calls") or []):
        if not isinstance(call, Mapping):
            continue
        fn = call.get("function")
        if isinstance(fn, Mapping):
            name, arguments = fn.get("name"), fn.get("arguments")
        else:  # a custom tool's call as returned: its input, in the arguments' form a client sends back
            custom = call.get("custom")
            body: Mapping[str, Any] = custom if isinstance(custom, Mapping) else {}
            name, arguments = body.get("name"), json.dumps({"input": body.get("input") or ""})
        parts.append((f"tool_calls[{i}].name", str(name or "")))
        parts.append((f"tool_calls[{i}].arguments", str(arguments or "")))
    return tuple(parts)


def returned_reply(response: Mapping[str, Any]) -> tuple[Parts, bool]:
    """A chat completion's reply in parts, and whether the server dropped part of what the model wrote
    (a call cut by max_tokens or an interruption; the stop string that ended it)."""
    choice = response["choices"][0]
    cut = choice.get("incomplete_tool_call") is not None or choice.get("stop_reason") is not None
    return message_parts(choice.get("message")), cut


def sent_back(messages: Sequence[Mapping[str, Any]], at: int) -> Parts:
    """The reply the client sent back: the message at ``at`` (right after the previous request's
    messages) when it is the assistant's, else nothing (``()``: the reply was left out)."""
    if at < len(messages) and messages[at].get("role") == "assistant":
        return message_parts(messages[at])
    return ()
