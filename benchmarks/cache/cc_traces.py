"""agentserve bench traces: Claude Code traces (kv-cache-tester format) replayed on the prefix cache.

The traces (GitHub ``callanjfox/kv-cache-tester``, folder ``traces/``, Apache-2.0) hold per
request ``t`` (seconds from the trace's start), ``in``/``out`` tokens, ``api_time``,
``think_time``, ``stop`` and ``hash_ids``: one id per 64-token block, equal ids = equal blocks,
scoped to one trace (``hash_id_scope: local``; sub-agents share their parent's ids).

**cache-only** mode (no model, no HTTP) drives the real ``server.kvcache.PrefixCache``: its
policies (``lru``, ``session``), its byte budget and its second tier (``HostStore``). One
*unit* of the simulated prompt is one 64-token block of the trace: hash id ``h`` of trace
``k`` is the unit ``k * 2**32 + h`` (same id, same unit, within a trace only). The cache's
blocks are ``--block-units`` units (default 4 = 256 tokens; reuse stays unit-granular through
the cache's token-granular tails). A unit weighs ``64 x --kv-bytes-per-token`` bytes (128 KiB:
an 8B model's bf16 KV), so ``--hbm-tokens 450000`` is the KV of an 8B model on one H100.

Timing: ``--users`` traces run at once (the next trace starts when one ends); a trace's
requests fire at their recorded ``t`` times ``--time-scale``. A request looks the cache up
(its session key is the trace's id), inserts its prompt, and its reply ends
``api_time x time-scale`` later (``reply_finished``: waits on a tool when ``stop`` is
``tool_use``, else on a person). With ``--hints`` every request carries Claude Code's
retention hint (``cache_control`` ephemeral, 5 minutes: ``--hint-s``). With ``--retain`` the
prompt is inserted again when its reply ends, as the hf engine does (it holds the request's KV
while the reply runs and puts prompt + reply back into the cache): blocks evicted meanwhile
come back without a recompute, and the chain is touched as just used.

``ceiling``: the share of input units an infinite cache would serve (per id space, a trace and
its sub-agents, the longest prefix of a request's ids that an earlier request had): ``hit_share_of_ceiling``
= hit / ceiling. The last line printed is one JSON object per run.

**live** mode (``--mode live --url [NAME=]URL ...``): the same traces, scaled down, against
running servers (agentserve on either engine, stock vLLM, ...): ``benchmarks/cache/cc_traces_live.py``.

Examples:
  agentserve bench traces --traces /work/cc-traces/traces --range 1-600 --users 32 \\
      --hbm-tokens 450000 --policy session+tier2 --host-tokens 8000000
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from server.kvcache.cost_model import CostModel  # noqa: E402
from server.kvcache.prefix_cache import PrefixCache  # noqa: E402
from server.kvcache.tier2 import HostStore  # noqa: E402

BLOCK_TOKENS = 64  # tokens per hash id (the trace format's block_size)
KV_BYTES_PER_TOKEN = 128 * 1024  # an 8B model (32 layers, 8 KV heads x 128, bf16)
HINT_PASSES = {"off": (False,), "on": (True,), "both": (False, True)}  # --hints: runs without / with
POLICIES = ("lru", "session", "session+tier2", "lru+tier2")
TOOL = "tool"  # the traces do not name tools: one name for every tool call


@dataclass(frozen=True)
class Request:
    t: float
    units: tuple[int, ...]
    api_s: float
    tool_call: bool  # the reply ended on a tool call (stop: tool_use)


@dataclass(frozen=True)
class Trace:
    name: str
    requests: tuple[Request, ...]

    @property
    def units(self) -> int:
        return sum(len(r.units) for r in self.requests)


def _requests(raw: Sequence[dict[str, Any]], ns: int) -> list[Request]:
    out = []
    for r in raw:
        if "hash_ids" not in r:
            continue
        units = tuple(ns + int(h) for h in r["hash_ids"])
        api = float(r.get("api_time") or r.get("ttft") or 0.0)
        out.append(Request(float(r.get("t", 0.0)), units, api, r.get("stop") == "tool_use"))
    return out


def load_trace(path: Path, index: int) -> list[Trace]:
    """The trace and its sub-agents (each a trace of its own, in the parent's id space)."""
    data = json.loads(path.read_text())
    ns = index << 32
    raw = data.get("requests", [])
    main = [r for r in raw if r.get("type") != "subagent"]
    out = [Trace(path.stem, tuple(_requests(main, ns)))]
    for k, sub in enumerate(r for r in raw if r.get("type") == "subagent"):
        t0 = float(sub.get("t", 0.0))
        reqs = [
            Request(t0 + q.t, q.units, q.api_s, q.tool_call) for q in _requests(sub.get("requests", []), ns)
        ]
        out.append(Trace(f"{path.stem}/sub{k}", tuple(reqs)))
    return [t for t in out if t.requests]


def trace_files(folder: Path, first: int, last: int) -> list[tuple[int, Path]]:
    """(index, path) of ``trace_NNNN.json`` with first <= NNNN <= last."""
    out = []
    for p in sorted(folder.glob("trace_*.json")):
        try:
            n = int(p.stem.split("_")[1])
        except (IndexError, ValueError):
            continue
        if first <= n <= last:
            out.append((n, p))
    return out


def load_traces(folder: Path, first: int = 0, last: int = 10**9) -> list[Trace]:
    traces: list[Trace] = []
    for n, p in trace_files(folder, first, last):
        traces.extend(load_trace(p, n))
    return traces


def id_spaces(traces: Sequence[Trace]) -> list[list[Trace]]:
    """The traces grouped by id space: a trace file and its sub-agents (``NAME/subK``) share one."""
    groups: dict[str, list[Trace]] = {}
    for t in traces:
        groups.setdefault(t.name.split("/")[0], []).append(t)
    return list(groups.values())


def ceiling_units(*traces: Trace) -> int:
    """Units an infinite prefix cache serves on traces of one id space (a trace and its sub-agents):
    per request, in time order, the longest prefix of its ids that an earlier request had (chained,
    as block hashes are). A sub-agent's request can reuse its parent's blocks, so the ceiling is
    counted over the id space, not per trace."""
    seen: set[int] = set()
    hit = 0
    for r in sorted((r for t in traces for r in t.requests), key=lambda r: r.t):
        key = 0
        matched = True
        for u in r.units:
            key = hash((key, u))
            if matched and key in seen:
                hit += 1
            else:
                matched = False
                seen.add(key)
    return hit


class SimKV:
    """A block's KV stand-in: only its size (tier 2 takes anything shaped like a tensor)."""

    __slots__ = ("nbytes",)
    device = "cpu"

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def numel(self) -> int:
        return self.nbytes

    def element_size(self) -> int:
        return 1

    def detach(self) -> SimKV:
        return self

    def to(self, *args: Any, **kwargs: Any) -> SimKV:
        return self

    def pin_memory(self) -> SimKV:
        return self


@dataclass
class Config:
    policy: str = "session+tier2"
    users: int = 32
    hbm_tokens: int = 450_000
    host_tokens: int = 0
    hints: bool = False
    hint_s: float = 300.0
    time_scale: float = 1.0
    block_units: int = 4
    kv_bytes_per_token: int = KV_BYTES_PER_TOKEN
    session_cap_s: float = 600.0
    workers: int = 1
    routing: str = "affinity"
    retain: bool = False  # insert the prompt again when the reply ends (the hf engine's ``retain``)

    @property
    def unit_bytes(self) -> int:
        return BLOCK_TOKENS * self.kv_bytes_per_token

    def label(self) -> str:
        host = f" host {self.host_tokens / 1e6:g}M" if self.host_tokens else ""
        hints = " hints" if self.hints else ""
        return f"{self.policy}{hints} hbm {self.hbm_tokens / 1e6:g}M{host} users {self.users}"


def make_cache(cfg: Config) -> PrefixCache:
    policy, _, tier = cfg.policy.partition("+")
    if policy not in ("lru", "session") or tier not in ("", "tier2"):
        raise SystemExit(f"--policy must be one of {', '.join(POLICIES)}, got {cfg.policy!r}")
    store = HostStore(cfg.host_tokens * cfg.kv_bytes_per_token) if tier and cfg.host_tokens else None
    if tier and store is None:
        raise SystemExit(f"--policy {cfg.policy}: give the host tier's size (--host-tokens)")
    clock = VirtualClock()
    cache = PrefixCache(
        cfg.block_units,
        cfg.hbm_tokens * cfg.kv_bytes_per_token,
        policy=policy,
        tier2=store,
        cost=CostModel("always"),  # host RAM -> GPU is cheaper than a prefill of the same tokens
        clock=clock,
        max_sessions=max(4096, 4 * cfg.users),
        session_cap_s=cfg.session_cap_s,
    )
    return cache


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Stats:
    requests: int = 0
    units: int = 0
    hit_units: int = 0
    ceiling_units: int = 0
    tier2_units: int = 0
    returning: int = 0  # requests after a pause of >= 60 s (virtual)
    returning_units: int = 0
    returning_hit: int = 0
    per_trace: dict[str, float] = field(default_factory=dict)


def _events(traces: Sequence[Trace], cfg: Config) -> Iterator[tuple[float, int, str, int, int]]:
    """(time, seq, kind, trace index, request index) in time order: users start traces as they free up."""
    heap: list[tuple[float, int, str, int, int]] = []
    seq = 0
    pending = iter(range(len(traces)))

    def start(at: float) -> None:
        nonlocal seq
        k = next(pending, None)
        if k is None:
            return
        t0 = traces[k].requests[0].t
        for i, r in enumerate(traces[k].requests):
            heapq.heappush(heap, (at + (r.t - t0) * cfg.time_scale, seq, "req", k, i))
            seq += 1
        last = traces[k].requests[-1]
        done = at + (last.t - t0 + last.api_s) * cfg.time_scale
        heapq.heappush(heap, (done, seq, "done", k, -1))
        seq += 1

    for _ in range(cfg.users):
        start(0.0)
    while heap:
        ev = heapq.heappop(heap)
        if ev[2] == "done":
            start(ev[0])
            continue
        yield ev
        if ev[2] == "req":
            r = traces[ev[3]].requests[ev[4]]
            heapq.heappush(heap, (ev[0] + r.api_s * cfg.time_scale, seq, "end", ev[3], ev[4]))
            seq += 1


def _router(cfg: Config) -> Any:
    from server.config import RoutingSettings
    from server.routing.policies import make_policy

    return make_policy(RoutingSettings(policy=cfg.routing))


def replay(traces: Sequence[Trace], cfg: Config, cache: PrefixCache | None = None) -> dict[str, Any]:
    """One cache-only run: the JSON object the command prints. With ``cfg.workers`` > 1 every
    worker has its own cache of the configured size and the router's policy places each request."""
    from server.routing.policy import WorkerLoad
    from server.routing.request import RouteRequest

    caches = [cache or make_cache(cfg)] + [make_cache(cfg) for _ in range(cfg.workers - 1)]
    clocks = [c.clock for c in caches]
    router = _router(cfg) if cfg.workers > 1 else None
    in_flight = [0] * cfg.workers
    served = [0] * cfg.workers
    where: dict[int, int] = {}  # trace -> the worker of its last request
    moved = 0
    peak_imbalance: list[float] = []
    st = Stats()
    last_end: dict[int, float] = {}
    unit_bytes = cfg.unit_bytes
    t_start = time.perf_counter()
    st.ceiling_units = sum(ceiling_units(*space) for space in id_spaces(traces))
    retain = cfg.hint_s if cfg.hints else 0.0
    turns: dict[int, int] = {}
    placed: dict[tuple[int, int], int] = {}
    for at, _, kind, k, i in _events(traces, cfg):
        for clock in clocks:
            assert isinstance(clock, VirtualClock)
            clock.now = at
        tr = traces[k]
        r = tr.requests[i]
        if kind == "end":
            w = placed.pop((k, i))
            in_flight[w] -= 1
            if cfg.retain:  # the engine held the KV while the reply ran: it goes back into the cache
                n = len(r.units)
                blocks = functools.partial(
                    _payload, n_units=n, block_units=cfg.block_units, unit_bytes=unit_bytes
                )
                caches[w].insert(r.units, "", blocks, tail=True, session=tr.name)
            caches[w].reply_finished(tr.name, (TOOL,) if r.tool_call else ())
            last_end[k] = at
            continue
        w = 0
        if router is not None:
            loads = [WorkerLoad(str(j), True, in_flight[j]) for j in range(cfg.workers)]
            sel = router.select_worker(RouteRequest(tr.name, None, turns.get(k, 0)), loads)
            w = sel.worker
            moved += k in where and where[k] != w
            mean = sum(in_flight) / cfg.workers
            if mean > 0:
                peak_imbalance.append(max(in_flight) / mean)
        where[k] = w
        turns[k] = turns.get(k, 0) + 1
        placed[(k, i)] = w
        in_flight[w] += 1
        served[w] += 1
        c = caches[w]
        ids = r.units
        m = c.match(ids, session=tr.name, retain_s=retain)
        hit = m.cached_tokens
        n = len(ids)
        blocks = functools.partial(_payload, n_units=n, block_units=cfg.block_units, unit_bytes=unit_bytes)
        c.insert(ids, "", blocks, tail=True, session=tr.name)
        st.requests += 1
        st.units += n
        st.hit_units += hit
        st.tier2_units += m.tier2_tokens
        if k in last_end and at - last_end[k] >= 60.0 * cfg.time_scale:
            st.returning += 1
            st.returning_units += n
            st.returning_hit += hit
    bytes_from_tier2 = sum(int(c.stats().get("prefix_cache_bytes_from_tier2", 0)) for c in caches)
    ceiling = st.ceiling_units / st.units if st.units else 0.0
    share = st.hit_units / st.units if st.units else 0.0
    out: dict[str, Any] = {
        "policy": cfg.policy,
        "hints": cfg.hints,
        "retain": cfg.retain,
        "users": cfg.users,
        "hbm_tokens": cfg.hbm_tokens,
        "host_tokens": cfg.host_tokens,
        "time_scale": cfg.time_scale,
        "block_tokens": cfg.block_units * BLOCK_TOKENS,
        "traces": len({t.name.split("/")[0] for t in traces}),
        "requests": st.requests,
        "input_tokens": st.units * BLOCK_TOKENS,
        "ceiling": round(ceiling, 5),
        "hit": round(share, 5),
        "hit_share_of_ceiling": round(share / ceiling, 5) if ceiling else None,
        "tokens_recomputed": (st.units - st.hit_units) * BLOCK_TOKENS,
        "tokens_recomputed_over_ceiling": (st.ceiling_units - st.hit_units) * BLOCK_TOKENS,
        "tokens_from_tier2": st.tier2_units * BLOCK_TOKENS,
        "bytes_from_tier2": bytes_from_tier2,
        "returning_requests": st.returning,
        "returning_hit": round(st.returning_hit / st.returning_units, 5) if st.returning_units else None,
        "evictions": sum(c.evictions for c in caches),
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    if router is not None:
        peak_imbalance.sort()
        out.update(
            workers=cfg.workers,
            routing=cfg.routing,
            sessions_moved=moved,
            requests_per_worker=served,
            load_imbalance_mean=round(sum(peak_imbalance) / len(peak_imbalance), 3)
            if peak_imbalance
            else None,
            load_imbalance_p95=round(peak_imbalance[int(0.95 * (len(peak_imbalance) - 1))], 3)
            if peak_imbalance
            else None,
        )
    return out


def _payload(block: int, n_units: int, block_units: int, unit_bytes: int) -> tuple[SimKV, int]:
    units = min(block_units, n_units - block * block_units)
    nbytes = units * unit_bytes
    return SimKV(nbytes), nbytes


def parse_range(text: str) -> tuple[int, int]:
    a, _, b = text.partition("-")
    return int(a or 0), int(b or 10**9)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="agentserve bench traces",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--traces", required=True, help="folder of trace_NNNN.json files")
    ap.add_argument("--range", default="", help="trace numbers FIRST-LAST (e.g. 1-600); default all")
    ap.add_argument("--mode", choices=["cache-only", "live"], default="cache-only")
    ap.add_argument(
        "--url", action="append", help="live: [NAME=]URL of a server (repeat: one arm each, run in turn)"
    )
    ap.add_argument("--users", type=int, default=32, help="traces replayed at once")
    ap.add_argument("--hbm-tokens", type=int, default=450_000, help="tier-1 KV capacity in tokens")
    ap.add_argument("--host-tokens", type=int, default=0, help="tier-2 (host RAM) capacity in tokens")
    ap.add_argument(
        "--policy", default="session+tier2", help=f"one of {', '.join(POLICIES)} (comma list: each)"
    )
    ap.add_argument("--hints", choices=list(HINT_PASSES), default="off", help="retention hints (5 min ttl)")
    ap.add_argument("--hint-s", type=float, default=300.0)
    ap.add_argument("--time-scale", type=float, default=1.0, help="recorded times x this (0.1: 10x faster)")
    ap.add_argument("--block-units", type=int, default=4, help="cache block size in 64-token units")
    ap.add_argument("--kv-bytes-per-token", type=int, default=KV_BYTES_PER_TOKEN)
    ap.add_argument("--workers", type=int, default=1, help="fleet: workers, each with a cache of this size")
    ap.add_argument("--routing", default="affinity", help="fleet: the router's policies (comma list: each)")
    ap.add_argument(
        "--retain",
        action="store_true",
        help="insert each prompt again when its reply ends (the hf engine does: its KV was held meanwhile)",
    )
    live = ap.add_argument_group("live mode (see benchmarks/cache/cc_traces_live.py)")
    live.add_argument("--tokens-per-block", type=int, default=2, help="real tokens per 64-token trace block")
    live.add_argument("--block-stride", type=int, default=1, help="keep every S-th trace block (0, S, 2S...)")
    live.add_argument("--max-requests", type=int, default=20, help="requests per trace (its first N)")
    live.add_argument("--max-blocks", type=int, default=600, help="prompts cut to their first N blocks")
    live.add_argument("--max-gap-s", type=float, default=10.0, help="longest scaled pause (s)")
    live.add_argument("--max-tokens", type=int, default=8, help="reply length cap (min with the trace's out)")
    live.add_argument("--returning-s", type=float, default=60.0, help="recorded pause that makes a return")
    live.add_argument("--kv-tokens", type=int, help="the servers' KV capacity in tokens (recorded only)")
    live.add_argument(
        "--server-block", type=int, default=0, help="also the ceiling of whole blocks of N tokens (vLLM: 32)"
    )
    ap.add_argument("--json", help="append each run's JSON object (one per line) to this file")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.mode == "live":
        from benchmarks.cache.cc_traces_live import main_live

        return main_live(args)
    first, last = parse_range(args.range)
    traces = load_traces(Path(args.traces), first, last)
    if not traces:
        print(f"no trace_NNNN.json in {args.traces} (range {args.range or 'all'})", file=sys.stderr)
        return 2
    hints = HINT_PASSES[args.hints]
    runs = [(p, h, r) for p in args.policy.split(",") for h in hints for r in args.routing.split(",")]
    for policy, h, routing in runs:
        cfg = Config(
            policy=policy,
            users=args.users,
            hbm_tokens=args.hbm_tokens,
            host_tokens=args.host_tokens if "tier2" in policy else 0,
            hints=h,
            hint_s=args.hint_s,
            time_scale=args.time_scale,
            block_units=args.block_units,
            kv_bytes_per_token=args.kv_bytes_per_token,
            workers=args.workers,
            routing=routing,
            retain=args.retain,
        )
        out = replay(traces, cfg)
        out["range"] = args.range or "all"
        line = json.dumps(out)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
