"""routing: the router in front of workers (server/routing/)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from server.config.section import Section


class RoutingSettings(Section):
    """The router in front of workers (``serve --workers N`` / ``route``); see server/routing/."""

    policy: Literal["affinity", "prefix_affinity", "prefix", "round_robin", "least_loaded"] = Field(
        "affinity",
        description="affinity = rendezvous hash of tenant + session key with bounded load; prefix_affinity "
        "= the prompt prefix's (system + tools) order in bands, each band ordered by the session key; "
        "prefix = prefix only. See server/routing/rendezvous.py and docs/deploy.md.",
    )
    prefix_spread: int = Field(
        16, ge=1, description="prefix_affinity: an agent's sessions share out its first k prefix workers."
    )
    slow_start_s: float = Field(
        600.0,
        ge=0,
        description="After a worker (re)joins, only new sessions go to it for this long "
        "(established sessions stay where their KV cache is). 0 = off.",
    )
    upstream: Literal["raw", "aiohttp", "httpx"] = Field(
        "raw", description="HTTP client of the proxy hot path (raw = persistent HTTP/1.1 on httptools)."
    )
    dns_interval_s: float = Field(
        10.0, gt=0, description="route --workers-dns: seconds between re-resolving the worker DNS name."
    )
    load_epsilon: float = Field(
        2.0,
        ge=0.0,
        description="Spill a session when its worker has > (1+eps) x mean in-flight requests "
        "(a spill re-prefills the session's context elsewhere: see benchmarks/results/fleet_sim.md); with "
        "load_epsilon_new, the bound of established sessions (first turns are held to a tighter one).",
    )
    load_epsilon_new: float | None = Field(
        0.1,
        ge=0.0,
        description="A session's first turn spills past (1+eps) x mean in-flight, its second "
        "past (1+2 eps), doubling per turn up to load_epsilon: young sessions (little KV to lose) keep the "
        "fleet "
        "level, old ones stay put. null = one flat bound (load_epsilon) for every turn.",
    )
    load_floor: int = Field(
        4, ge=1, description="Never spill from a worker that would hold at most this many requests in flight."
    )
    health_interval_s: float = Field(1.0, gt=0, description="Seconds between worker health checks.")
    health_timeout_s: float = Field(
        3.0, gt=0, description="A worker whose GET /health takes longer than this counts as failed."
    )
    health_failures: int = Field(
        2,
        ge=1,
        description="Consecutive failed health checks before a worker is taken out "
        "(a refused connection on a request takes it out at once).",
    )
    connect_timeout_s: float = Field(2.0, gt=0, description="Timeout to connect to a worker.")
    read_timeout_s: float = Field(
        300.0, gt=0, description="Longest wait for the next byte from a worker (bounds a hung worker)."
    )
    max_failovers: int = Field(
        2, ge=0, description="Other workers tried when one fails before anything reached the client."
    )
    worker_start_timeout_s: float = Field(180.0, gt=0, description="How long to wait for spawned workers.")
    max_lost_replays: int = Field(
        1,
        ge=0,
        description="A request whose worker dropped the connection before answering (it may have "
        "killed the worker) is replayed to another worker at most this many times.",
    )
    max_worker_losses: int = Field(
        2,
        ge=1,
        description="A request body that this many workers died on is refused (503) instead of sent again.",
    )
