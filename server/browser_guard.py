"""What a web page can make a browser send, refused before any route runs (worker and router alike).

- **Content type.** A page on any site can POST to ``http://127.0.0.1:8000`` without a CORS
  preflight when the body is a "simple" one: ``text/plain``, a form, or no type at all (a Blob).
  It cannot read the answer, but on a keyless server the request still runs (a generation, a
  stored response). Every POST here takes JSON, so every POST must say so: anything but
  ``application/json`` (or an ``application/*+json`` type) is a 415 before the body is read. A
  JSON type makes a cross-origin browser request preflighted, and nothing here answers a
  preflight, so the browser never sends it.
- **Host.** DNS rebinding turns a page's own name (``evil.example``) into ``127.0.0.1`` after it
  loaded: the page is then same-origin with the server and reads every answer, and its requests
  carry ``Host: evil.example``. A keyless server answers only Hosts it knows
  (``auth.allowed_hosts``), IP literals, ``localhost`` and names of one label (a Compose service,
  a short cluster name): a rebinding page cannot have those, its origin is a name in public DNS,
  which has a dot. Anything else is a 421. A keyed server lets the key decide
  (a page cannot read the key), unless ``auth.allowed_hosts`` is set. Health probes
  (``/health``, ``/health/live``) are never refused for their Host.
"""

from __future__ import annotations

import ipaddress

from server.config import Settings
from server.errors import AgentServeError

PROBE_PATHS = frozenset({"/health", "/health/live"})


class UnsupportedMediaType(AgentServeError):
    status = 415
    type = "invalid_request_error"
    default_code = "unsupported_media_type"


class HostNotAllowed(AgentServeError):
    status = 421
    type = "invalid_request_error"
    default_code = "host_not_allowed"


def is_json(content_type: str | None) -> bool:
    """``application/json`` or ``application/*+json``, any parameters (``; charset=utf-8``)."""
    if not content_type:
        return False
    kind, _, sub = content_type.split(";", 1)[0].strip().lower().partition("/")
    return kind == "application" and (sub == "json" or sub.endswith("+json"))


def content_type_refusal(method: str, content_type: str | None) -> UnsupportedMediaType | None:
    """Why a request with this method and ``Content-Type`` is refused; None when it may go on."""
    if method != "POST" or is_json(content_type):
        return None
    sent = f"Content-Type {content_type[:80]!r}" if content_type else "no Content-Type"
    return UnsupportedMediaType(
        f"the request body must be JSON and say so: this POST has {sent}; send the header "
        "'Content-Type: application/json' (a browser page cannot send that cross-origin without a "
        "preflight, which this server does not answer)"
    )


def host_name(host: str) -> str:
    """The name of a ``Host`` header value, without its port (``[::1]:8000`` → ``::1``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    name, _, port = host.rpartition(":")
    return name if name and port.isdigit() else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_allowed(name: str, allowed: list[str]) -> bool:
    """IP literals, ``localhost`` (``*.localhost``), names of one label (``worker-1``, a Compose
    service; no page on the web has one) and the names of ``allowed``."""
    name = name.rstrip(".")
    if _is_ip(name) or "." not in name or name.endswith(".localhost"):
        return True
    for entry in allowed:
        entry = entry.lower()
        if entry == "*" or entry == name or (entry.startswith("*.") and name.endswith(entry[1:])):
            return True
    return False


def checks_host(settings: Settings) -> bool:
    """Whether this process checks ``Host``: keyless, or ``auth.allowed_hosts`` set."""
    auth = settings.auth
    return bool(auth.allowed_hosts) or not (auth.api_keys or auth.require_router)


def host_refusal(path: str, host: str | None, settings: Settings) -> HostNotAllowed | None:
    """Why a request with this ``Host`` is refused; None when it may go on (no Host: not a browser)."""
    if host is None or path in PROBE_PATHS or not checks_host(settings):
        return None
    name = host_name(host)
    if host_allowed(name, settings.auth.allowed_hosts):
        return None
    shown = name[:100]
    return HostNotAllowed(
        f"Host {shown!r} is not served here (a web page that rebound its name to this server would send "
        "it): add it to auth.allowed_hosts (AGENTSERVE_AUTH__ALLOWED_HOSTS='[\"" + shown + "\"]') to "
        "serve it; localhost, IP addresses and names without a dot are always served"
    )
