"""Ids both ways: the chat request id <-> ``msg_…``, a chat call id <-> ``toolu_…``.

The mapping is a fixed prefix swap, so no table is kept: a Message id names the chat
response the cache reporter knows (``diagnostics.previous_message_id`` works), and a
``tool_use`` id sent back renders as the call id the model's family expects (Mistral's
9-character ids survive the round trip).
"""

from __future__ import annotations

CHAT_PREFIX = "chatcmpl-"
MESSAGE_PREFIX = "msg_"
TOOL_PREFIX = "toolu_"


def message_id(chat_id: str) -> str:
    return MESSAGE_PREFIX + chat_id.removeprefix(CHAT_PREFIX)


def chat_id(message_id: str) -> str:
    """The chat response id behind one of our Message ids (another id is returned unchanged)."""
    if message_id.startswith(MESSAGE_PREFIX) and len(message_id) > len(MESSAGE_PREFIX):
        return CHAT_PREFIX + message_id.removeprefix(MESSAGE_PREFIX)
    return message_id


def tool_use_id(call_id: str) -> str:
    return TOOL_PREFIX + call_id


def call_id(tool_use_id: str) -> str:
    """The chat call id of a ``tool_use`` id (``toolu_X`` -> ``X``)."""
    rest = tool_use_id.removeprefix(TOOL_PREFIX)
    return rest or tool_use_id
