"""API keys and tenants: who is calling, and which cache namespace they get.

With no keys configured every caller is the anonymous tenant "". With keys, a
request must send ``Authorization: Bearer KEY`` (or Anthropic's ``x-api-key: KEY``, which
Claude Code sends; the Bearer header wins when both come) for one of them (401 otherwise);
its tenant names the prefix-cache namespace and prefixes its session keys, so one
tenant's prompt is never served from (or timed against) another tenant's cache.
Keys are compared in constant time and never logged.

Keys at the edge: the router authenticates too (the same ``auth`` settings), so a bad
key is a 401 at the router and no worker sees the request. It then forwards the
request with the client's Authorization header unchanged, and, when ``router_token``
is set, adds ``X-Agentserve-Tenant: NAME`` and ``X-Agentserve-Router-Token: TOKEN``.
A worker trusts the tenant header only together with that token (constant-time
compare): then it needs no tenant keys of its own. Spoofing: the router strips both
headers from what clients send; a worker that gets the tenant header without the
right token answers 401 (it never falls back to trusting it); without ``router_token``
the router sends no tenant header and each worker checks the forwarded key itself.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from server.config import AuthSettings, ConfigError
from server.errors import Unauthorized

ANONYMOUS = ""
TENANT_HEADER = "x-agentserve-tenant"
TOKEN_HEADER = "x-agentserve-router-token"
KEYED_PATHS = ("/tokenize", "/detokenize")  # outside /v1 but they run the model's tokenizer: keyed too


def needs_key(path: str, protect_metrics: bool) -> bool:
    """Whether a worker request on ``path`` must authenticate (/health is always open)."""
    return path.startswith("/v1/") or path in KEYED_PATHS or (path == "/metrics" and protect_metrics)


def authenticate(headers: Mapping[str, str], auth: AuthSettings) -> str:
    """The caller's tenant name; raises Unauthorized when keys are configured and none matches,
    or when a router's tenant header comes without the router token."""
    if auth.require_router or TOKEN_HEADER in headers or TENANT_HEADER in headers:
        return _from_router(headers, auth)
    return authenticate_key(headers, auth)


def authenticate_key(headers: Mapping[str, str], auth: AuthSettings) -> str:
    """The tenant of the request's API key (what the router checks at the edge)."""
    if not auth.api_keys:
        return ANONYMOUS
    scheme, _, key = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():  # Anthropic clients (Claude Code) send x-api-key
        key = headers.get("x-api-key", "")
    if not key.strip():
        raise Unauthorized(
            "missing API key: send the header 'Authorization: Bearer YOUR_KEY' or 'x-api-key: YOUR_KEY' "
            "(openai client: OpenAI(api_key=...); anthropic client / Claude Code: ANTHROPIC_API_KEY)"
        )
    key_bytes = key.strip().encode()
    tenant = None
    for name, expected in auth.api_keys.items():  # check all: no early exit to time
        if hmac.compare_digest(key_bytes, expected.encode()):
            tenant = name
    if tenant is None:
        raise Unauthorized("invalid API key: check the key you were given (keys are per tenant)")
    return tenant


def _from_router(headers: Mapping[str, str], auth: AuthSettings) -> str:
    token = headers.get(TOKEN_HEADER, "")
    if not auth.router_token or not hmac.compare_digest(token.encode(), auth.router_token.encode()):
        raise Unauthorized(
            "X-Agentserve-Tenant is accepted only from the router, with the router token: call the "
            "router (or drop the header); operators: set the same auth.router_token on router and workers"
        )
    return headers.get(TENANT_HEADER, ANONYMOUS)


def check_worker_auth(auth: AuthSettings) -> None:
    """Refuse a worker auth setup that would serve someone unauthenticated (fail closed)."""
    if auth.require_router and not auth.router_token:
        raise ConfigError(
            "auth.require_router is set but auth.router_token is empty: no request could be trusted. "
            "Set auth.router_token (AGENTSERVE_AUTH__ROUTER_TOKEN) to the routers' token"
        )
    if auth.router_token and not auth.api_keys and not auth.require_router:
        raise ConfigError(
            "auth.router_token is set but auth.api_keys is empty: a request that reaches this worker "
            "without the router would be served with no key. Set auth.require_router: true "
            "(AGENTSERVE_AUTH__REQUIRE_ROUTER=true) when only routers can reach the worker, "
            "or set auth.api_keys"
        )


def check_router_auth(auth: AuthSettings) -> None:
    """Refuse a router that checks keys but cannot tell the workers who the tenant is."""
    if auth.api_keys and not auth.router_token:
        raise ConfigError(
            "auth.api_keys is set on the router but auth.router_token is empty: the workers would "
            "not learn the tenant the router authenticated. Set auth.router_token "
            "(AGENTSERVE_AUTH__ROUTER_TOKEN; the same secret on routers and workers, and "
            "auth.require_router: true on the workers)"
        )


def router_headers(tenant: str, auth: AuthSettings) -> list[tuple[bytes, bytes]]:
    """What the router adds to a proxied request (nothing without a router token)."""
    if not auth.router_token:
        return []
    return [(TENANT_HEADER.encode(), tenant.encode()), (TOKEN_HEADER.encode(), auth.router_token.encode())]


def cache_salt(tenant: str, auth: AuthSettings) -> str:
    return "" if auth.share_prefix_cache else tenant


def namespaced_session(tenant: str, key: str) -> str:
    return f"{tenant}\x00{key}" if tenant else key
