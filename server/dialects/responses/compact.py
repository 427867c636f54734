"""``POST /v1/responses/compact`` as data: the summary request, the compacted response, its item.

OpenAI's shape (``openai`` SDK ``responses.compact``): the body is a Responses body (``model``,
``input``, ``instructions``, ``previous_response_id``, ``prompt_cache_key``, …; Codex also sends its
``tools``); the answer is ``{"id", "object": "response.compaction", "created_at", "output", "usage"}``
whose ``output`` is every user message of the conversation, as rendered (role, text; no other key),
followed by one ``compaction`` item. Sent back in a later ``input``, that item stands for everything
the summary replaced.

The served model writes the summary: the conversation as a normal Responses request (same
instructions, tools and key, so its prefix comes from the session's cache) plus one user message,
``SUMMARY_REQUEST``, with tool calls masked out (``tool_choice: "none"``) and at most
``default_max_tokens`` tokens (less if the window holds less). A conversation over the window is
the usual 400: compaction is asked before the window is full (Codex: at the catalog's
``auto_compact_token_limit``).

What the compaction item holds: nothing is encrypted. ``encrypted_content`` is ``MARK`` followed by
the summary exactly as the model wrote it. It renders as a user message, ``SUMMARY_HEADER`` + the
summary. A compaction item this server did not make (no ``MARK``: e.g. OpenAI's encrypted one) is a
400: its content cannot be read here.
"""

from __future__ import annotations

from typing import Any

from server.errors import InvalidRequest

MARK = "agentserve.compaction.v1:"
SUMMARY_HEADER = "Summary of the conversation so far (earlier messages were compacted into it):\n"
SUMMARY_REQUEST = (
    "Summarize the conversation so far so that the work can continue from the summary alone: the "
    "user's goal, what was done (files read or changed, commands run and what they showed), the "
    "decisions made, and what is left to do. Write only the summary."
)
# body fields the summary request does not take over (it is one non-streamed, unstored reply)
NOT_FORWARDED = ("input", "stream", "store", "tool_choice", "max_output_tokens", "background")


def summary_body(body: dict[str, Any]) -> dict[str, Any]:
    """The Responses body whose reply is the summary (the client's input + ``SUMMARY_REQUEST``)."""
    value = body.get("input")
    items: list[Any] = [{"role": "user", "content": value}] if isinstance(value, str) else []
    if isinstance(value, list):
        items = list(value)
    elif value is not None and not isinstance(value, str):
        raise InvalidRequest("input must be a string or a list of input items", param="input")
    if not items and body.get("previous_response_id") is None:
        raise InvalidRequest("nothing to compact: send the conversation in input", param="input")
    out = {k: v for k, v in body.items() if k not in NOT_FORWARDED}
    out["input"] = [*items, {"type": "message", "role": "user", "content": SUMMARY_REQUEST}]
    out["store"] = False
    if body.get("tools"):
        out["tool_choice"] = "none"
    return out


def compaction_item(item_id: str, summary: str) -> dict[str, Any]:
    return {"id": item_id, "type": "compaction", "encrypted_content": MARK + summary}


def summary_of(item: dict[str, Any], where: str) -> str:
    """The summary text a compaction item (made here) carries; 400 for one made elsewhere."""
    content = item.get("encrypted_content")
    if not isinstance(content, str) or not content.startswith(MARK):
        raise InvalidRequest(
            f"{where} is a compaction item this server did not make (its content is not readable "
            "here): send the conversation itself, or compact it with this server's /v1/responses/compact",
            param=f"{where}.encrypted_content",
        )
    return content[len(MARK) :]


def user_messages(items: list[Any]) -> list[Any]:
    """The user messages of a conversation (OpenAI's compacted output keeps them), as rendered: role
    and content, a text part's type and text; no other key is echoed (a 99-byte request naming a
    stored conversation whose items carried 2 MiB of keys nothing reads came back as 2 MiB)."""
    return [
        {"type": "message", "role": "user", "content": _rendered(i.get("content"))}
        for i in items
        if isinstance(i, dict) and i.get("type", "message") == "message" and i.get("role") == "user"
    ]


def _rendered(content: Any) -> Any:
    if not isinstance(content, list):
        return content  # a string (anything else was a 400 before the conversation was served)
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        key = "refusal" if kind == "refusal" else "text"
        if isinstance(part, dict) and isinstance(part.get(key), str):
            parts.append({"type": kind, key: part[key]})
    return parts


def compacted(
    response_id: str,
    created_at: int,
    items: list[Any],
    summary: str,
    usage: dict[str, Any] | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """OpenAI's ``response.compaction`` object (``extra``: our extensions, e.g. ``cache``)."""
    compaction = compaction_item("cmp_" + response_id.removeprefix("resp_"), summary)
    return {
        "id": response_id,
        "object": "response.compaction",
        "created_at": created_at,
        "output": [*user_messages(items), compaction],
        "usage": usage,
        **extra,
    }
