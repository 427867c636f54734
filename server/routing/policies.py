"""Every routing policy by name: the one table the router, the benchmarks and the fleet simulation
build policies from (``make_policy``). A new policy: a module with a factory taking ``RoutingSettings``
(see ``policy.py`` for the interface), a line here, and its name in ``RoutingSettings.policy``."""

from __future__ import annotations

from server.config import RoutingSettings
from server.routing import least_loaded, rendezvous, round_robin
from server.routing.policy import PolicyFactory, RoutingPolicy

POLICIES: dict[str, PolicyFactory] = {
    "affinity": rendezvous.make,
    "prefix": rendezvous.make_prefix,
    "prefix_affinity": rendezvous.make_prefix_affinity,
    "round_robin": round_robin.make,
    "least_loaded": least_loaded.make,
}


def policy_names() -> list[str]:
    return sorted(POLICIES)


def make_policy(settings: RoutingSettings) -> RoutingPolicy:
    try:
        factory = POLICIES[settings.policy]
    except KeyError:
        raise ValueError(
            f"unknown routing policy {settings.policy!r}: use one of {', '.join(sorted(POLICIES))}"
        ) from None
    return factory(settings)
