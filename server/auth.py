"""API keys and tenants: who is calling, and which cache namespace they get.

With no keys configured every caller is the anonymous tenant "". With keys, a
request must send ``Authorization: Bearer KEY`` for one of them (401 otherwise);
its tenant names the prefix-cache namespace and prefixes its session keys, so one
tenant's prompt is never served from (or timed against) another tenant's cache.
Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from server.config import AuthSettings
from server.errors import Unauthorized

ANONYMOUS = ""


def authenticate(headers: Mapping[str, str], auth: AuthSettings) -> str:
    """The caller's tenant name; raises Unauthorized when keys are configured and none matches."""
    if not auth.api_keys:
        return ANONYMOUS
    header = headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized(
            "missing API key: send the header 'Authorization: Bearer YOUR_KEY' "
            "(with the openai client: OpenAI(api_key=...))"
        )
    key = key.strip().encode()
    tenant = None
    for name, expected in auth.api_keys.items():  # check all: no early exit to time
        if hmac.compare_digest(key, expected.encode()):
            tenant = name
    if tenant is None:
        raise Unauthorized("invalid API key: check the key you were given (keys are per tenant)")
    return tenant


def cache_salt(tenant: str, auth: AuthSettings) -> str:
    return "" if auth.share_prefix_cache else tenant


def namespaced_session(tenant: str, key: str) -> str:
    return f"{tenant}\x00{key}" if tenant else key
