"""auth: API keys, the router token, tenants' cache namespaces."""

from __future__ import annotations

from pydantic import Field

from server.config.section import Section


class AuthSettings(Section):
    api_keys: dict[str, str] = Field(
        default_factory=dict,
        description="tenant name -> API key. Empty = no auth. Clients send 'Authorization: Bearer KEY'. "
        'From the environment: AGENTSERVE_AUTH__API_KEYS=\'{"team-a": "sk-..."}\'. Never logged.',
    )
    protect_metrics: bool = Field(
        False, description="Require a key for /metrics too (/health is always open)."
    )
    router_token: str = Field(
        "",
        description="Shared secret between router and workers: the router sends it with the tenant it "
        "authenticated (X-Agentserve-Tenant), and a worker trusts that header only with this token. "
        "Empty = workers check the forwarded API key themselves. Never logged.",
    )
    require_router: bool = Field(
        False,
        description="Worker only: this worker is reached only through routers; every keyed path "
        "(/v1/*, /tokenize, /detokenize) needs auth.router_token (401 otherwise), so a request that "
        "bypasses the router is refused even with no auth.api_keys here. Needs auth.router_token.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names this process answers besides localhost and IP addresses ('*.example.com' "
        "for subdomains, '*' for any). Checked on a keyless server always (DNS rebinding: a web page whose "
        "name now points here sends its own name), on a keyed one only when set; 421 otherwise. Add the "
        "public name a proxy forwards as Host, and on keyless workers the names the router reaches them by.",
    )
    share_prefix_cache: bool = Field(
        False,
        description="Let tenants share cached prefixes (off: each tenant's cache is its own namespace).",
    )
