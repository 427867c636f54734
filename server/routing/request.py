"""What the router knows of one request when it places it: ``RouteRequest``, built once per POST.

The proxy reads the body once and derives everything a policy may use (the tenant's session
placement digest, the prefix hash for policies that place by it, the conversation's turn); the
one object then travels proxy → forward → router → policy unchanged, so a new routing input is
one field here, not a keyword through five signatures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from server.auth import namespaced_session
from server.session_key import HEADER, SessionKey, prefix_hash, response_digest, session_key


@dataclass(slots=True)
class RouteRequest:
    """A request's routing inputs (not frozen: a frozen dataclass costs ~5x as much to build, and
    the router builds one per request; nothing changes it after ``route_request``)."""

    key: str  # placement digest of the tenant's session (``SessionKey.placement``)
    prefix: str | None = None  # the tenant-namespaced prefix hash; None unless the policy uses it
    turns: int | None = None  # assistant turns so far (``assistant_turns``); None: unknown

    @property
    def new_session(self) -> bool:
        """A session's first turn (no assistant message yet): slow start lets only these onto a
        warming worker. Unknown (None, e.g. completions) counts as established."""
        return self.turns == 0


def assistant_turns(body: bytes) -> int | None:
    """A conversation's turn: its assistant messages (chat, Messages) or assistant and function-call
    items (Responses ``input``), counted as the bytes '"assistant"' / '"function_call"', so text
    quoting them only makes the request look older: a looser load bound, never a stricter one.
    A Responses request continuing a stored one (``previous_response_id``) counts at least 1.
    None for a request without a conversation (completions)."""
    if b'"messages"' in body:
        return body.count(b'"assistant"')
    if b'"input"' in body:
        turns = body.count(b'"assistant"') + body.count(b'"function_call"')
        return max(turns, 1) if b'"previous_response_id"' in body else turns
    return None


def route_request(
    body: bytes, headers: dict[str, str], with_prefix: bool, tenant: str = "", salt: str = ""
) -> RouteRequest:
    """The request's ``RouteRequest``, parsing the JSON body only when it can matter.
    ``with_prefix``: the policy places by the prefix hash (``RoutingPolicy.uses_prefix``);
    ``salt``: the tenant's cache namespace (``auth.cache_salt``)."""
    turns = assistant_turns(body)
    if not with_prefix and b'"prompt_cache_key"' not in body and HEADER in headers:
        sk = session_key({}, headers)  # the header wins when the body has no prompt_cache_key
        return RouteRequest(_placed(sk, tenant), None, turns)
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        parsed = {}  # the worker will answer 400; route it somewhere stable
    if not isinstance(parsed, dict):
        parsed = {}
    prefix = namespaced_session(salt, prefix_hash(parsed)) if with_prefix else None
    return RouteRequest(_placed(session_key(parsed, headers), tenant), prefix, turns)


_STORED = "/v1/responses/"


def stored_response_route(path: str) -> RouteRequest | None:
    """``/v1/responses/{id}[/...]``: placed by the digest the worker wrote into the id (the
    session's placement, ``session_key.response_id``), so GET / DELETE / cancel reach the
    worker that stored it, as a ``previous_response_id`` turn does. None for any other path or
    an id of another form (then any worker: it answers 404 unless it has it)."""
    if not path.startswith(_STORED):
        return None
    digest = response_digest(path[len(_STORED) :].split("/", 1)[0])
    return RouteRequest(digest, None, 1) if digest is not None else None


def _placed(sk: SessionKey, tenant: str) -> str:
    """The digest the worker's ``Prepared.session.placement`` has for the same request."""
    return SessionKey(namespaced_session(tenant, sk.key), sk.source, sk.digest).placement
