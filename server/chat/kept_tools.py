"""Mask, don't remove — at the server: a named session's removed tools stay in the prompt, masked.

The tool definitions sit near the top of the prompt, so a request whose tool list changed
recomputes everything after them. Clients remove tools mid-session (Codex compacts by sending
the whole history again with ``tools: []``; modes and sub-agents with fewer tools; MCP servers
that drop out). When a request of a *named* session (``NAMED_SOURCES``: a session key the client
chose, or ``previous_response_id``) sends a subset of the tools its previous turn rendered —
fewer, none, or the same ones in another order — the previous list is rendered instead, and the
plan (made from the tools the client sent) leaves the others out of the allowed set: the masks
make a removed tool impossible to call (none left: no call at all, as ``tool_choice: "none"``).
A tool that is new, or whose definition changed, is a real change: the list is rendered as
sent, and the cache report names it.

What is remembered, per worker: each session's last rendered tool list, keyed by tenant and the
session's placement digest (``SessionKey.placement``: a ``previous_response_id`` turn carries the
digest of the session it continues, so it finds the turn before it). Bounded: ``sessions``
entries (LRU) and ``max_bytes`` of distinct lists (sessions sharing a list hold it once; its
size is its JSON's). Nothing here reads a clock or a random source: what is rendered depends
only on the requests this worker saw, in order. A worker that never saw the session's previous
turn (a restart, another worker after a failover) renders the tools as sent: that turn misses
the cache as it would have anyway (its KV is not on that worker either).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# session key sources that name one conversation (server/session_key.py); not ``user`` (one person's
# many sessions) nor ``prefix_hash`` (it hashes the tools: another list is another session anyway)
NAMED_SOURCES = frozenset(
    {"prompt_cache_key", "header", "claude_code_header", "metadata.user_id", "previous_response_id"}
)


def _name(tool: dict[str, Any]) -> str:
    fn = tool.get("function")  # custom tools too (server/protocol.py): names are checked by plan_tools
    return str(fn.get("name", "")) if isinstance(fn, dict) else ""


def _canonical(tool: dict[str, Any]) -> str:
    return json.dumps(tool, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _exact(tool: dict[str, Any]) -> str:
    return json.dumps(tool, ensure_ascii=False, separators=(",", ":"))  # the client's key order


@dataclass(frozen=True)
class KeptTools:
    """The tool list to render instead of the one sent, and the names it keeps but masks."""

    rendered: list[dict[str, Any]]
    masked: list[str]  # in the rendered order; empty when only the order was kept


def keep(previous: list[dict[str, Any]], sent: list[dict[str, Any]]) -> KeptTools | None:
    """The previous list when ``sent`` is a subset of it (each tool equal to the previous one of its
    name, JSON key order aside) that differs from it (fewer, another order, keys in another order:
    the earlier form is rendered); else None."""
    if not previous or len(sent) > len(previous):
        return None
    before = {_name(t): _canonical(t) for t in previous}
    names = [_name(t) for t in sent]
    edited = any(before.get(n) != _canonical(t) for n, t in zip(names, sent, strict=True))
    if len(set(names)) != len(names) or edited:
        return None  # a new or edited tool: a real change, rendered as sent
    if [_exact(t) for t in previous] == [_exact(t) for t in sent]:
        return None  # the same list as rendered before, byte for byte: nothing to keep
    sent_names = set(names)
    return KeptTools(list(previous), [_name(t) for t in previous if _name(t) not in sent_names])


class ToolMemory:
    """Each session's last rendered tool list: LRU over ``sessions`` entries and ``max_bytes`` of
    distinct lists (interned by digest). Thread-safe: requests are prepared in threads."""

    def __init__(self, sessions: int = 4096, max_bytes: int = 32 * 2**20) -> None:
        self.capacity, self.max_bytes = sessions, max_bytes
        self._entries: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._lists: dict[bytes, tuple[list[dict[str, Any]], int, int]] = {}  # digest -> (tools, size, refs)
        self.bytes = 0
        self._lock = threading.Lock()

    def get(self, tenant: str, session: str) -> list[dict[str, Any]] | None:
        with self._lock:
            d = self._entries.get((tenant, session))
            if d is None:
                return None
            self._entries.move_to_end((tenant, session))
            return self._lists[d][0]

    def put(self, tenant: str, session: str, tools: list[dict[str, Any]]) -> None:
        text = "\n".join(_exact(t) for t in tools)
        d = hashlib.sha256(text.encode()).digest()
        size = len(text.encode())
        key = (tenant, session)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._release(old)
            if size > self.max_bytes:
                return
            held = self._lists.get(d)
            if held is None:
                self._lists[d] = (tools, size, 1)
                self.bytes += size
            else:
                self._lists[d] = (held[0], held[1], held[2] + 1)
            self._entries[key] = d
            while self._entries and (len(self._entries) > self.capacity or self.bytes > self.max_bytes):
                _, dropped = self._entries.popitem(last=False)
                self._release(dropped)

    def _release(self, d: bytes) -> None:
        tools, size, refs = self._lists[d]
        if refs > 1:
            self._lists[d] = (tools, size, refs - 1)
        else:
            del self._lists[d]
            self.bytes -= size

    def __len__(self) -> int:
        return len(self._entries)
