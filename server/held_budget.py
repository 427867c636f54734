"""Memory the Responses WebSockets' held conversations take, charged against a process-wide budget
and a tenant's share of it (``websocket.held_conversations_mb``, ``limits.tenant_share``).

A socket holds its latest conversation for ``previous_response_id`` as parsed JSON: Python objects,
not bytes. Charged in what they cost: ``HELD_RATIO`` x the conversation's JSON bytes, the worst ratio
measured (``json.loads`` under ``tracemalloc``, Python 3.11): 1.5x for agent turns (messages, calls,
tool outputs of tens to thousands of characters), 6.4x for a list of tiny items (``{"type":
"message", "role": "user", "content": "x"}``), which is what a client maximising its footprint
sends. Each socket may hold ``websocket.max_conversation_bytes``; without a total, ~42 sockets of
16 MiB reached 16 GiB. Past the budget a conversation is not held (its next turn is the 400
``conversation_too_large``, naming this budget) and nothing is evicted from anyone else.
"""

from __future__ import annotations

import math
import threading

HELD_RATIO = 6.5  # bytes of Python objects per JSON byte, worst case measured (module docstring)


class HeldBudget:
    """Charged bytes per holder (a socket), per tenant and in all; thread-safe (charged in threads)."""

    def __init__(self, limit_bytes: int, tenant_share: float) -> None:
        self.limit = limit_bytes
        self.tenant_limit = max(1, math.ceil(tenant_share * limit_bytes))
        self.total = 0
        self.by_tenant: dict[str, int] = {}
        self.held: dict[int, tuple[str, int]] = {}  # holder id -> (tenant, charged)
        self.lock = threading.Lock()

    @staticmethod
    def cost(json_bytes: int) -> int:
        return math.ceil(json_bytes * HELD_RATIO)

    def hold(self, holder: object, tenant: str, json_bytes: int) -> bool:
        """Charge ``holder``'s conversation (replacing its previous charge); False, and nothing
        charged, when it would pass the process budget or the tenant's share."""
        charged = self.cost(json_bytes)
        with self.lock:
            self._drop(id(holder))
            mine = self.by_tenant.get(tenant, 0)
            if self.total + charged > self.limit or mine + charged > self.tenant_limit:
                return False
            self.held[id(holder)] = (tenant, charged)
            self.total += charged
            self.by_tenant[tenant] = mine + charged
            return True

    def release(self, holder: object) -> None:
        with self.lock:
            self._drop(id(holder))

    def _drop(self, key: int) -> None:
        found = self.held.pop(key, None)
        if found is None:
            return
        tenant, charged = found
        self.total -= charged
        left = self.by_tenant[tenant] - charged
        if left > 0:
            self.by_tenant[tenant] = left
        else:
            del self.by_tenant[tenant]
