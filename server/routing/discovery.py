"""Worker discovery from DNS: ``agentserve route --workers-dns NAME:PORT``.

NAME is typically a Kubernetes headless Service: its A/AAAA records are the addresses of
the ready pods behind it (a StatefulSet of workers). Every ``routing.dns_interval_s`` the
name is resolved again and the pool updated: new addresses join (unhealthy until their
first health check answers 200), vanished ones leave; the others keep their state. A
failed lookup keeps the current workers (a DNS hiccup must not empty the fleet).

Worker ids are ``ADDRESS:PORT``: every router replica resolving the same name derives the
same ids, so their rendezvous orders agree (they may differ for up to one interval after a
change). A worker pod that restarts with a new address is a new worker to the hash, which
is right: its cache is empty anyway.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable

from server.routing.workers import WorkerPool, WorkerSpec

log = logging.getLogger("agentserve.routing")

# (name, port) -> the addresses it resolves to
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolver(name: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def worker_specs(addresses: list[str], port: int) -> list[WorkerSpec]:
    """One spec per distinct address, sorted (the pool's order does not affect routing)."""
    specs = []
    for addr in sorted(set(addresses)):
        host = f"[{addr}]" if ipaddress.ip_address(addr).version == 6 else addr
        specs.append(WorkerSpec(f"{host}:{port}", f"http://{host}:{port}"))
    return specs


class DnsDiscovery:
    def __init__(self, name: str, port: int, interval_s: float, resolver: Resolver = system_resolver) -> None:
        self.name, self.port, self.interval_s, self.resolver = name, port, interval_s, resolver
        self._task: asyncio.Task[None] | None = None
        self.last_error: str | None = None

    @classmethod
    def parse(cls, target: str, interval_s: float, resolver: Resolver = system_resolver) -> DnsDiscovery:
        name, sep, port = target.rpartition(":")
        if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"--workers-dns {target!r}: expected NAME:PORT, e.g. "
                "agentserve-workers.default.svc.cluster.local:8000"
            )
        return cls(name, int(port), interval_s, resolver)

    async def refresh(self, pool: WorkerPool) -> bool:
        """Resolve once and update the pool; False (pool unchanged) when the lookup failed."""
        try:
            addresses = await self.resolver(self.name, self.port)
        except OSError as exc:
            self.last_error = f"cannot resolve {self.name}: {exc}"
            log.warning("workers-dns: %s; keeping the %d current workers", self.last_error, len(pool.workers))
            return False
        self.last_error = None
        added, removed = pool.set_specs(worker_specs(addresses, self.port))
        if added or removed:
            log.info("workers-dns %s: +%s -%s", self.name, added, removed)
            await asyncio.gather(*(pool.check(w) for w in pool.workers if w.id in added))
        return True

    async def start(self, pool: WorkerPool) -> None:
        await self.refresh(pool)
        self._task = asyncio.create_task(self._loop(pool), name="agentserve-dns")

    async def _loop(self, pool: WorkerPool) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.refresh(pool)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
