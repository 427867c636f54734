"""Routing benchmarks: router overhead, and prompt tokens served from cache per policy.

1. overhead: one fast fake worker, called directly and through `agentserve route`
   (interleaved, sequential requests): added latency p50/p99 per body size; then a lean
   keep-alive client (optionally paced: --rate) loads a fresh router process per run and the
   router's CPU seconds per request come from /proc. --router-root DIR (repeat) alternates
   router builds from other checkouts in one run, --rounds times: compare builds at one rate.
2. cache: an agent-like trace (sessions that append tool results turn after turn,
   a system prompt + tools shared by all sessions) through a router with each policy
   over 4 workers. By default the workers are SIMULATED (server.routing.fake_worker:
   whitespace "tokens", 16-token blocks, chained-hash prefix cache per worker,
   prefill cost per uncached token, one prefill at a time per worker); the ideal is
   one infinite cache seeing the same requests. `--real-worker URL` (x N) runs the
   trace against real workers instead (the ideal is then approximated as each turn's
   previous prompt + reply).

Usage:
  python benchmarks/fleet/routing_bench.py                 # both parts, markdown tables
  python benchmarks/fleet/routing_bench.py --part overhead --upstream raw --rate 300 --rounds 4 \
      --router-root ../old-checkout --router-root .   # before/after, alternated
  python benchmarks/fleet/routing_bench.py --part cache --sessions 32 --turns 10
  python benchmarks/fleet/routing_bench.py --part cache --scale 0.05 --real-worker http://127.0.0.1:8001 ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from server.ports import free_port, wait_for_health  # noqa: E402
from server.routing.fake_worker import FakeEngine, _prompt_text  # noqa: E402

PY = sys.executable
# (label, policy, extra router environment)
POLICIES = (
    ("affinity", "affinity", {}),
    ("affinity, load_floor=8", "affinity", {"AGENTSERVE_ROUTING__LOAD_FLOOR": "8"}),
    ("round_robin", "round_robin", {}),
    ("least_loaded", "least_loaded", {}),
)


# ---------------------------------------------------------------- processes


def _listening_socket() -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(512)
    return s


def _wait(url: str, proc: subprocess.Popen, timeout_s: float = 30) -> None:
    wait_for_health(url, timeout_s, proc, poll_s=0.1)


def start_fake_workers(n: int, prefill_s_per_token: float) -> tuple[list[str], list[subprocess.Popen]]:
    urls, procs = [], []
    for i in range(n):
        sock = _listening_socket()
        procs.append(
            subprocess.Popen(
                [
                    PY,
                    "-m",
                    "server.routing.fake_worker",
                    "--id",
                    f"w{i}",
                    "--fd",
                    str(sock.fileno()),
                    f"--prefill-s-per-token={prefill_s_per_token}",
                ],
                pass_fds=[sock.fileno()],
                cwd=ROOT,
            )
        )
        urls.append(f"http://127.0.0.1:{sock.getsockname()[1]}")
        sock.close()
    for url, proc in zip(urls, procs, strict=True):
        _wait(url, proc)
    return urls, procs


def start_router(
    worker_urls: Sequence[str],
    policy: str,
    env: dict[str, str] | None = None,
    root: Path = ROOT,
) -> tuple[str, subprocess.Popen]:
    """`agentserve route` from the checkout at ``root`` (another build to compare: --router-root)."""
    port = free_port()
    argv = [PY, "-m", "server.cli", "route", "--port", str(port), "--policy", policy]
    for i, u in enumerate(worker_urls):
        argv += ["--worker", f"w{i}={u}"]
    proc = subprocess.Popen(
        argv,
        cwd=root,
        stderr=subprocess.DEVNULL,
        env={
            **os.environ,
            "PYTHONPATH": str(root),
            "AGENTSERVE_ROUTING__READ_TIMEOUT_S": "120",
            **(env or {}),
        },
    )
    url = f"http://127.0.0.1:{port}"
    _wait(url, proc)
    return url, proc


def stop(procs: Sequence[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


# ---------------------------------------------------------------- part 1: overhead

BODIES: dict[str, dict] = {
    "chat, 0.2 KB": {
        "model": "fake",
        "messages": [{"role": "user", "content": "hi"}],
        "prompt_cache_key": "s",
        "max_tokens": 8,
    },
    "chat, 32 KB": {
        "model": "fake",
        "messages": [{"role": "system", "content": "word " * 6500}],
        "max_tokens": 8,
    },
    "stream, 0.2 KB": {
        "model": "fake",
        "messages": [{"role": "user", "content": "hi"}],
        "prompt_cache_key": "s",
        "stream": True,
    },
}


def overhead(
    n: int,
    concurrency: int,
    seconds: float,
    upstream: str,
    rate: float | None = None,
    roots: Sequence[Path] = (ROOT,),
    rounds: int = 1,
) -> None:
    (worker,), wprocs = start_fake_workers(1, 0.0)
    try:
        latency(worker, upstream, n)
        body = json.dumps(BODIES["chat, 0.2 KB"]).encode()
        throughput(worker, upstream, body, concurrency, seconds, rate, roots, rounds)
    finally:
        stop(wprocs)


def latency(worker: str, upstream: str, n: int) -> None:
    """Added latency p50/p99 per body, sequential requests, direct and via the router interleaved."""
    router, rproc = start_router([worker], "prefix_affinity", {"AGENTSERVE_ROUTING__UPSTREAM": upstream})
    print(f"\n## Upstream client: {upstream}")
    try:
        print(f"\n### Router overhead (fake worker, {n} sequential requests per row, interleaved)\n")
        print(
            "| request | direct p50 | via router p50 | added p50 | direct p99 | via router p99 | added p99 |"
        )
        print("|---|---|---|---|---|---|---|")
        with httpx.Client(timeout=30, trust_env=False) as client:
            for name, body in BODIES.items():
                lat: dict[str, list[float]] = {"direct": [], "router": []}
                for i in range(n + 50):
                    for target, base in (("direct", worker), ("router", router)):
                        t0 = time.perf_counter()
                        resp = client.post(base + "/v1/chat/completions", json=body)
                        resp.read()
                        took = time.perf_counter() - t0
                        assert resp.status_code == 200, resp.text
                        if i >= 50:  # warm-up
                            lat[target].append(took * 1000)
                d50, r50 = pct(lat["direct"], 0.5), pct(lat["router"], 0.5)
                d99, r99 = pct(lat["direct"], 0.99), pct(lat["router"], 0.99)
                print(
                    f"| {name} | {d50:.2f} ms | {r50:.2f} ms | **{r50 - d50:.2f} ms** | {d99:.2f} ms | "
                    f"{r99:.2f} ms | **{r99 - d99:.2f} ms** |"
                )
            metrics = client.get(router + "/metrics").text
        s = c = 0.0
        for line in metrics.splitlines():
            if line.startswith("agentserve_router_added_latency_seconds_sum"):
                s = float(line.split()[-1])
            if line.startswith("agentserve_router_added_latency_seconds_count"):
                c = float(line.split()[-1])
        print(
            f"\nRouter's own histogram (time spent in the router itself): mean {1000 * s / c:.3f} ms "
            f"over {int(c)} requests"
        )
    finally:
        stop([rproc])


def throughput(
    worker: str,
    upstream: str,
    body: bytes,
    concurrency: int,
    seconds: float,
    rate: float | None,
    roots: Sequence[Path],
    rounds: int,
) -> None:
    """Router CPU per request under load, for each router build in ``roots``, alternated
    ``rounds`` times (a fresh router process per run, one worker for all)."""
    paced = f"paced at {rate:.0f} req/s" if rate else "as fast as the worker answers"
    print(
        f"\n### Router throughput ({concurrency} keep-alive connections, {paced}, {seconds:.0f} s per run; "
        f"lean client + router + worker sharing {os.cpu_count()} cores)\n"
    )
    print(
        "| router build | requests | wall req/s | router busy | CPU per request | **req/s per router core** |"
    )
    print("|---|---|---|---|---|---|")
    per_req: dict[Path, list[float]] = {r: [] for r in roots}
    for _ in range(rounds):
        for root in roots:
            router, rproc = start_router(
                [worker], "prefix_affinity", {"AGENTSERVE_ROUTING__UPSTREAM": upstream}, root
            )
            try:
                done, wall, cpu = asyncio.run(load(router, rproc.pid, body, concurrency, seconds, rate))
            finally:
                stop([rproc])
            per_req[root].append(cpu / done)
            print(
                f"| {root.name} | {done} | {done / wall:.0f} | {cpu / wall:.0%} | "
                f"{1000 * cpu / done:.3f} ms | **{done / cpu:.0f}** |"
            )
    if rounds > 1 or len(roots) > 1:
        print(
            "\n| router build | runs | CPU per request, median (min-max) "
            "| **req/s per router core, median** |"
        )
        print("|---|---|---|---|")
        for root, xs in per_req.items():
            print(
                f"| {root.name} | {len(xs)} | {1000 * statistics.median(xs):.3f} ms "
                f"({1000 * min(xs):.3f}-{1000 * max(xs):.3f}) | **{1 / statistics.median(xs):.0f}** |"
            )


async def load(
    url: str, pid: int, body: bytes, concurrency: int, seconds: float, rate: float | None
) -> tuple[int, float, float]:
    """POST ``body`` to the router's /v1/chat/completions over ``concurrency`` keep-alive
    connections, paced at ``rate`` requests/s in all (None: each connection sends its next
    request as soon as the last answer arrived). A lean client (pre-encoded request, responses
    read by content-length) so that the client, not the router, is not what limits the run.
    Returns (requests answered, wall seconds, router CPU seconds)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    done = sent = 0

    async def connection(stop_at: float, t0: float) -> None:
        nonlocal done, sent
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while True:
                if rate:
                    due = t0 + sent / rate
                    sent += 1
                    if due >= stop_at:
                        return
                    if due > time.perf_counter():
                        await asyncio.sleep(due - time.perf_counter())
                elif time.perf_counter() >= stop_at:
                    return
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 "), head
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                done += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(connection(t0 + 1.0, t0) for _ in range(concurrency)))  # warm-up
    done = sent = 0
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    await asyncio.gather(*(connection(t0 + seconds, t0) for _ in range(concurrency)))
    return done, time.perf_counter() - t0, cpu_seconds(pid) - cpu0


# ---------------------------------------------------------------- part 2: cache hits per policy


def make_trace(sessions: int, turns: int, seed: int, salt: str, scale: float = 1.0) -> list[list[str]]:
    """Per session, the tool results of each turn (the system prompt + tools are shared)."""
    rng = random.Random(seed)
    vocab = [f"{salt}v{i}" for i in range(5000)]
    lo, hi = max(1, int(150 * scale)), max(2, int(700 * scale))
    return [
        [" ".join(rng.choices(vocab, k=rng.randint(lo, hi))) for _ in range(turns)] for _ in range(sessions)
    ]


def system_prompt(salt: str, scale: float = 1.0) -> str:
    rng = random.Random(7)
    words = ["open", "read", "click", "type", "list", "file", "page", "shell"]
    tools = json.dumps(
        [
            {"name": f"{p}_{i}", "description": " ".join(rng.choices(words, k=30))}
            for p in ("browser", "shell", "file")
            for i in range(max(1, int(10 * scale)))
        ]
    )
    return f"{salt} You are an agent. " + "Follow the rules. " * max(1, int(100 * scale)) + tools


async def run_trace(
    router: str, trace: list[list[str]], concurrency: int, salt: str, real: bool, scale: float
) -> dict:
    sysmsg = system_prompt(salt, scale)
    ideal_engine = FakeEngine("ideal")
    stats = {"prompt": 0, "cached": 0, "ideal": 0, "shared": 0, "latency": [], "workers": {}}
    # cache hits every request can have anywhere: the full blocks of the shared system prompt
    shared = FakeEngine("shared").block_size * (
        len(_prompt_text({"messages": [{"role": "system", "content": sysmsg}]}).split())
        // FakeEngine("shared").block_size
    )
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits, trust_env=False) as client:
        model = (await client.get(router + "/v1/models")).json()["data"][0]["id"]

        async def session(s: int, observations: list[str]) -> None:
            async with sem:
                msgs = [
                    {"role": "system", "content": sysmsg},
                    {"role": "user", "content": f"task {salt} {s}"},
                ]
                prev_total = 0
                for t, obs in enumerate(observations):
                    body = {
                        "model": model,
                        "messages": msgs,
                        "max_tokens": 16,
                        "temperature": 0,
                        "prompt_cache_key": f"{salt}-session-{s}",
                    }
                    t0 = time.perf_counter()
                    resp = await client.post(router + "/v1/chat/completions", json=body)
                    stats["latency"].append(time.perf_counter() - t0)
                    assert resp.status_code == 200, resp.text
                    out = resp.json()
                    usage = out["usage"]
                    stats["prompt"] += usage["prompt_tokens"]
                    stats["cached"] += usage["prompt_tokens_details"]["cached_tokens"]
                    stats["shared"] += 0 if real else shared
                    if real:
                        stats["ideal"] += prev_total if t else 0
                        prev_total = usage["prompt_tokens"] + usage["completion_tokens"]
                    else:
                        stats["ideal"] += ideal_engine.prefix_lookup(_prompt_text(body))[1]
                    wid = resp.headers["x-agentserve-worker"]
                    stats["workers"].setdefault(s, set()).add(wid)
                    reply = out["choices"][0]["message"]["content"] or ""
                    msgs = msgs + [{"role": "assistant", "content": reply}, {"role": "tool", "content": obs}]

        await asyncio.gather(*(session(s, obs) for s, obs in enumerate(trace)))
    return stats


def cache(
    sessions: int,
    turns: int,
    concurrency: int,
    workers: int,
    prefill: float,
    real_workers: Sequence[str],
    scale: float,
) -> None:
    real = bool(real_workers)
    if real:
        urls, wprocs = list(real_workers), []
    else:
        urls, wprocs = start_fake_workers(workers, prefill)
    label = (
        "real workers"
        if real
        else (
            f"SIMULATED workers (fake_worker: prefix cache of 16-token blocks, "
            f"{prefill * 1e6:.0f} us prefill per uncached token)"
        )
    )
    print(f"\n### Prompt tokens from cache per policy: {len(urls)} {label}\n")
    print(
        f"Trace: {sessions} agent sessions x {turns} turns, {concurrency} sessions at a time, no tool time "
        "between turns; a shared system prompt + tools; each turn appends the reply and a tool result "
        f"of {int(150 * scale)}-{int(700 * scale)} words (scale {scale}). "
        "*session part* leaves out the shared prefix (which every worker caches after its "
        "first request), i.e. what only the session's own worker can have.\n"
    )
    print(
        "| policy | prompt tokens | cached | cached / prompt | **cached / ideal** | session part: cached / "
        "ideal | sessions on 1 worker | latency p50 | latency p99 | spills |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    try:
        for label, policy, env in POLICIES:
            if not real:
                for u in urls:
                    httpx.post(u + "/fake/reset", timeout=10)
            router, rproc = start_router(urls, policy, env)
            salt = f"{policy}{random.randrange(10**6)}" if real else "x"
            try:
                trace = make_trace(sessions, turns, seed=1, salt=salt, scale=scale)
                st = asyncio.run(run_trace(router, trace, concurrency, salt, real, scale))
                metrics = httpx.get(router + "/metrics").text.splitlines()
                spills = sum(
                    float(line.split()[-1])
                    for line in metrics
                    if line.startswith('agentserve_router_affinity_total{outcome="spilled"}')
                )
            finally:
                stop([rproc])
            one = sum(len(w) == 1 for w in st["workers"].values())
            lat = st["latency"]
            own = (st["cached"] - st["shared"]) / max(1, st["ideal"] - st["shared"])
            print(
                f"| {label} | {st['prompt']:,} | {st['cached']:,} | {st['cached'] / st['prompt']:.1%} | "
                f"**{st['cached'] / max(1, st['ideal']):.1%}** | {own:.1%} | {one}/{sessions} | "
                f"{1000 * statistics.median(lat):.0f} ms | {1000 * pct(lat, 0.99):.0f} ms | {spills:.0f} |"
            )
    finally:
        stop(wprocs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["all", "overhead", "cache"], default="all")
    p.add_argument("--requests", type=int, default=1000, help="overhead: sequential requests per row")
    p.add_argument("--concurrency", type=int, default=32, help="overhead: concurrent clients")
    p.add_argument("--seconds", type=float, default=10.0, help="overhead: throughput run length")
    p.add_argument(
        "--rate",
        type=float,
        help="overhead: pace the throughput run at this many requests/s (default: unpaced); "
        "compare builds at one rate, since CPU per request falls as the router gets busier",
    )
    p.add_argument(
        "--upstream",
        action="append",
        choices=["raw", "aiohttp", "httpx"],
        help="overhead: the router's upstream client(s) to measure (default: all three)",
    )
    p.add_argument(
        "--router-root",
        action="append",
        type=Path,
        metavar="DIR",
        help="overhead: measure the throughput of the router from this checkout (repeat to compare "
        "builds: runs alternate between them; default: this checkout)",
    )
    p.add_argument("--rounds", type=int, default=1, help="overhead: throughput runs per router build")
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--session-concurrency", type=int, default=8)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--prefill-s-per-token", type=float, default=20e-6, help="simulated prefill cost")
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="cache: prompt size factor (e.g. 0.05 for real workers on a CPU)",
    )
    p.add_argument(
        "--real-worker",
        action="append",
        default=[],
        metavar="URL",
        help="run the cache part against these workers instead of simulated ones",
    )
    a = p.parse_args()
    a.upstream = a.upstream or ["raw", "aiohttp", "httpx"]
    if a.part in ("all", "overhead"):
        for upstream in a.upstream:
            overhead(
                a.requests,
                a.concurrency,
                a.seconds,
                upstream,
                a.rate,
                [p.resolve() for p in a.router_root or [ROOT]],
                a.rounds,
            )
    if a.part in ("all", "cache"):
        cache(
            a.sessions,
            a.turns,
            a.session_concurrency,
            a.workers,
            a.prefill_s_per_token,
            a.real_worker,
            a.scale,
        )


if __name__ == "__main__":
    main()
