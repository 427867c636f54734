"""The session key: which conversation a request belongs to (cache report, routing).

First found wins (every dialect: Chat Completions, Responses, Anthropic Messages):
  1. body ``prompt_cache_key`` (OpenAI's field; Codex sends its thread id),
  2. header ``X-Session-ID``,
  3. header ``X-Claude-Code-Session-Id`` (Claude Code),
  4. body ``metadata.user_id`` when it names a session: a JSON string holding ``session_id``
     (Claude Code 2.x), or the older ``user_…_session_<uuid>`` form,
  5. body ``user``,
  6. body ``previous_response_id`` of the form ``resp_<16 hex><16 hex>`` (Responses): its first 16
     hex are the session's *placement digest* (below), written into the id by the Responses
     adapter, so a turn that names its session only by the previous response lands where it is,
  7. else the prefix hash.

Values are used as sent, so the same id from two sources (Claude Code's header and its
``metadata.user_id``) is one session.

The *placement digest* of a session is ``sha256(key).hexdigest()[:16]`` of its tenant-namespaced
key (``SessionKey.placement``); the router places every request by it, and the Responses adapter
writes it into the ids of the responses it creates (``response_id``). So a session's first turn
(keyed by, say, its prefix hash) and a later turn keyed only by ``previous_response_id`` walk the
same rendezvous order, with no table shared between routers and workers.

The *prefix hash* is a hash of the conversation's stable head (what every session of one agent
shares), from the JSON body alone so that a router, which does not tokenize, and a worker derive
the same key: chat's leading system/developer messages, Anthropic's ``system``, Responses'
``instructions`` and leading system/developer ``input`` items, plus ``tools`` (``cache_control``
markers dropped: Claude Code moves them from turn to turn). Claude Code's first system block,
``x-anthropic-billing-header: cc_version=…; cc_entrypoint=…;`` (a per-request hash in some
versions), is left out of the hash, so it does not split one agent's sessions. The router places
a session by both (see ``server/routing/rendezvous.py``); ``prefix_hash`` is the same on every
turn of a session, since an agent's context is append-only.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

HEADER = "x-session-id"
CLAUDE_CODE_HEADER = "x-claude-code-session-id"
BILLING_HEADER = "x-anthropic-billing-header:"
_RESPONSE_ID = re.compile(r"resp_([0-9a-f]{16})[0-9a-f]{16}")
_LEGACY_USER_ID = re.compile(r"_session_([0-9A-Za-z-]+)$")


@dataclass(frozen=True)
class SessionKey:
    key: str
    # "prompt_cache_key" | "header" | "claude_code_header" | "metadata.user_id" | "user"
    # | "previous_response_id" | "prefix_hash"
    source: str
    digest: str | None = None  # the placement digest a previous_response_id carries

    @property
    def placement(self) -> str:
        """The session's placement digest: what the router places by (sha256(key)[:16], or the
        digest carried by the previous response's id)."""
        return self.digest or key_digest(self.key)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def response_id(session: SessionKey) -> str:
    """A new Responses id for ``session`` (tenant-namespaced): ``resp_`` + its placement digest +
    16 random hex. A later ``previous_response_id`` of it routes to the same worker."""
    return f"resp_{session.placement}{secrets.token_hex(8)}"


def response_digest(response_id: str) -> str | None:
    """The placement digest in a ``resp_<16 hex><16 hex>`` id; None for any other id."""
    m = _RESPONSE_ID.fullmatch(response_id)
    return m.group(1) if m else None


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no ASCII escaping, fixed separators."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))


def _header(headers: Mapping[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name), None)


def claude_code_session(metadata: Any) -> str | None:
    """The session id in Anthropic ``metadata.user_id`` as Claude Code writes it, else None."""
    user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    if not isinstance(user_id, str) or not user_id:
        return None
    if user_id.startswith("{"):
        try:
            parsed = json.loads(user_id)
        except ValueError:
            return None
        sid = parsed.get("session_id") if isinstance(parsed, dict) else None
        return sid if isinstance(sid, str) and sid else None
    m = _LEGACY_USER_ID.search(user_id)
    return m.group(1) if m else None


def session_key(body: Mapping[str, Any], headers: Mapping[str, str]) -> SessionKey:
    cache_key = body.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key:
        return SessionKey(cache_key, "prompt_cache_key")
    header = _header(headers, HEADER)
    if header:
        return SessionKey(header, "header")
    header = _header(headers, CLAUDE_CODE_HEADER)
    if header:
        return SessionKey(header, "claude_code_header")
    sid = claude_code_session(body.get("metadata"))
    if sid:
        return SessionKey(sid, "metadata.user_id")
    user = body.get("user")
    if isinstance(user, str) and user:
        return SessionKey(user, "user")
    previous = body.get("previous_response_id")
    digest = response_digest(previous) if isinstance(previous, str) else None
    if digest is not None:
        return SessionKey("resp:" + digest, "previous_response_id", digest)
    return SessionKey(prefix_hash(body), "prefix_hash")


def _texts(system: Any) -> list[Any]:
    """Anthropic ``system`` (a string or text blocks) as texts, Claude Code's billing line left out."""
    if isinstance(system, str):
        first, nl, rest = system.partition("\n")
        return [rest] if nl and first.startswith(BILLING_HEADER) else [system]
    if not isinstance(system, list):
        return []
    texts = [b.get("text") if isinstance(b, Mapping) else b for b in system]
    if texts and isinstance(texts[0], str) and texts[0].startswith(BILLING_HEADER):
        first, nl, rest = texts[0].partition("\n")
        texts = ([rest] if nl and rest else []) + texts[1:]
    return texts


def _leading(items: Any) -> list[Any]:
    """Contents of the leading system/developer messages (chat messages or Responses input items)."""
    head: list[Any] = []
    if not isinstance(items, list):
        return head
    for item in items:
        if (
            not isinstance(item, Mapping)
            or item.get("type", "message") != "message"
            or item.get("role") not in ("system", "developer")
        ):
            break
        head.append(item.get("content"))
    return head


def _tools(tools: Any) -> Any:
    if not isinstance(tools, list):
        return tools
    return [
        {k: v for k, v in t.items() if k != "cache_control"} if isinstance(t, Mapping) else t for t in tools
    ]


def prefix_hash(body: Mapping[str, Any]) -> str:
    """Hash of the conversation's stable head + tools (chat, Messages, Responses), or of the prompt
    (completions)."""
    if "messages" in body:  # chat completions; Anthropic Messages adds its top-level system
        head = _texts(body["system"]) if "system" in body else []
        head += _leading(body.get("messages"))
    elif "input" in body or "instructions" in body:  # Responses
        instructions = body.get("instructions")
        head = ([instructions] if instructions is not None else []) + _leading(body.get("input"))
    else:  # /v1/completions: the prompt itself is the only context there is
        head = [body.get("prompt")]
    digest = hashlib.sha256(canonical_json({"head": head, "tools": _tools(body.get("tools"))}).encode())
    return "h:" + digest.hexdigest()[:24]
