"""The session key: which conversation a request belongs to (cache report, routing).

First found wins: body ``prompt_cache_key`` (OpenAI's field), header ``X-Session-ID``,
body ``user``; else the prefix hash. The *prefix hash* is a hash of the conversation's
stable head (its leading system/developer messages and the tools: what every session
of one agent shares), computed from the JSON body alone so that a router, which does
not tokenize, and a worker derive the same key. The router places a session by both
(see ``server/routing/rendezvous.py``); ``prefix_hash`` is the same on every turn of a
session, since an agent's context is append-only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

HEADER = "x-session-id"


@dataclass(frozen=True)
class SessionKey:
    key: str
    source: str  # "prompt_cache_key" | "header" | "user" | "prefix_hash"


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no ASCII escaping, fixed separators."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))


def session_key(body: Mapping[str, Any], headers: Mapping[str, str]) -> SessionKey:
    cache_key = body.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key:
        return SessionKey(cache_key, "prompt_cache_key")
    header = next((v for k, v in headers.items() if k.lower() == HEADER), None)
    if header:
        return SessionKey(header, "header")
    user = body.get("user")
    if isinstance(user, str) and user:
        return SessionKey(user, "user")
    return SessionKey(prefix_hash(body), "prefix_hash")


def prefix_hash(body: Mapping[str, Any]) -> str:
    """Hash of the leading system/developer messages + tools (chat), or of the prompt (completions)."""
    messages = body.get("messages")
    head: list[Any] = []
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, Mapping) or message.get("role") not in ("system", "developer"):
                break
            head.append(message.get("content"))
    else:  # /v1/completions: the prompt itself is the only context there is
        head.append(body.get("prompt"))
    digest = hashlib.sha256(canonical_json({"head": head, "tools": body.get("tools")}).encode()).hexdigest()
    return "h:" + digest[:24]
