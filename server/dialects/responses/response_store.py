"""Stored responses (``store: true``) for ``previous_response_id`` and ``GET``/``DELETE /v1/responses/{id}``.

In memory, per tenant, least recently used first out, bounded by count and by bytes (the
JSON size of the conversation + the response): ``responses.store_max_responses`` and
``responses.store_max_bytes`` in the config, per tenant. An entry holds the conversation as
sent (the previous chain's items, then this request's ``input`` items, reasoning items with
their ``encrypted_content`` included) plus the output items, and the response object. A
worker restart forgets everything: a ``previous_response_id`` it no longer has is a 400.
An entry expires ``responses.store_ttl_s`` after it was stored (24 h by default): ``get`` no
longer finds it, and each ``put`` drops the tenant's expired entries.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Stored:
    items: list[Any]  # the conversation: input items as sent + this response's output items
    response: dict[str, Any]
    size: int
    at: float = field(default=0.0)  # when it was stored (the store's clock)


class ResponseStore:
    def __init__(
        self,
        max_responses: int,
        max_bytes: int,
        ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self.ttl_s, self.clock = ttl_s, clock
        self._tenants: dict[str, OrderedDict[str, Stored]] = {}
        self._bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def put(self, tenant: str, input_items: list[Any], response: dict[str, Any]) -> bool:
        """Keep a response; False when it alone is over the byte budget (then it is not kept)."""
        items = list(input_items) + list(response.get("output") or [])
        size = len(json.dumps([items, response], ensure_ascii=False, separators=(",", ":")).encode())
        if size > self.max_bytes:
            return False
        now = self.clock()
        with self._lock:
            table = self._tenants.setdefault(tenant, OrderedDict())
            old = table.pop(response["id"], None)
            used = self._bytes.get(tenant, 0) - (old.size if old else 0) + size
            for rid in [rid for rid, s in table.items() if self._expired(s, now)]:
                used -= table.pop(rid).size
            table[response["id"]] = Stored(items, response, size, now)
            while table and (len(table) > self.max_responses or used > self.max_bytes):
                _, gone = table.popitem(last=False)
                used -= gone.size
            self._bytes[tenant] = used
        return True

    def get(self, tenant: str, response_id: str) -> Stored | None:
        with self._lock:
            table = self._tenants.get(tenant)
            entry = table.get(response_id) if table else None
            if entry is not None and table is not None:
                if self._expired(entry, self.clock()):
                    del table[response_id]
                    self._bytes[tenant] -= entry.size
                    return None
                table.move_to_end(response_id)
            return entry

    def _expired(self, entry: Stored, now: float) -> bool:
        return self.ttl_s is not None and now - entry.at > self.ttl_s

    def delete(self, tenant: str, response_id: str) -> bool:
        with self._lock:
            table = self._tenants.get(tenant)
            entry = table.pop(response_id, None) if table else None
            if entry is None:
                return False
            self._bytes[tenant] -= entry.size
            return True
