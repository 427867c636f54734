"""Fleet simulation: session placement policies over a simulated GPU fleet (no models, no HTTP).

The policies are the router's own classes (server/routing); everything else is simulated:

- Fleet: ``--workers`` (64) workers, each with an LRU prefix cache of ``--cache-tokens`` tokens
  (default 1M: an 80 GB GPU serving an 8B model with an fp8 KV cache). Entries are an
  agent's prefix (system prompt + tools) and a session's own context; a session's entry only
  hits behind its agent's prefix on the same worker (chained block hashes, as in vLLM). Eviction
  cuts the least recently used entry from its tail (a block cache frees a chain's last blocks
  first), so a partly evicted context still serves its head; before 2026-11-23 the whole entry
  went, which overstated eviction losses a little (aff: 1.96% -> 1.91% of ideal).
- Tier 2 (``--tier2-tokens``, default 0 = none, as ``prefix_cache.tier2.memory_mb`` is 0 by
  default): what tier 1 evicts goes to host RAM (LRU, cut from the tail as well); a hit there
  counts as cached and costs a restore (``RESTORE_TOK_S``) instead of a prefill.
- Agents: ``--agents`` (50) types, each with its own 2-8k-token system+tools prefix;
  popularity is Zipf(1.0) (a few agents are most of the traffic).
- Sessions: ``--sessions`` (10,000), Poisson arrivals at ``--rate`` per second; turns per
  session log-normal (median 8, 1-60); each turn the model writes 50-400 tokens and a tool
  returns a log-normal result (median 800 tokens); between turns a tool pause (exponential,
  mean 4 s) or, one time in ten, a human pause (20-120 s).
- Service: a request takes 50 ms + uncached prompt tokens / 15k tok/s (prefill) + 15 ms per
  output token, with no queueing (a batching engine); misses therefore add load.
- Churn: at 30% of the arrival window ``--fail`` workers fail (in-flight requests are retried
  elsewhere, their caches are lost); at 50% ``--join`` new workers join; at 70% the failed
  ones come back empty.

The policies see what a router sees: session key, prefix hash, whether this is a first turn,
the turn number (assistant messages in the body), and per worker health and in-flight count.

Reported per policy: **hit rate of ideal** = cached prompt tokens / what one infinite cache
shared by the whole fleet would have served (each agent's prefix after its first request,
and each session's previous prompt + reply); prompt tokens cached; **load imbalance** =
max / mean in-flight requests over healthy workers, sampled every second of the steady
state (mean and 95th percentile over samples); **moved** = sessions that changed worker
between two consecutive turns (and moves per 1,000 turns; a failure forces a few).

Usage:
  python benchmarks/fleet/fleet_sim.py                  # all policies, results/fleet_sim.{md,json,png}
  python benchmarks/fleet/fleet_sim.py --sessions 2000  # quicker
  python benchmarks/fleet/fleet_sim.py --tier2-tokens 2000000 --only affinity,round_robin --out /tmp/t2
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from server.config import RoutingSettings  # noqa: E402
from server.routing.policies import make_policy  # noqa: E402
from server.routing.policy import RoutingPolicy, WorkerLoad  # noqa: E402
from server.routing.request import RouteRequest  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PREFILL_TOK_S, BASE_S, TPOT_S = 15_000.0, 0.05, 0.015
# tier 2 -> GPU: 8B fp8 KV is 64 KiB/token; ~13 GB/s of PCIe = ~200k tokens/s restored
RESTORE_TOK_S = 200_000.0


@dataclass
class Session:
    id: int
    agent: int
    turns: int
    own: int  # tokens of the session's own context in the next prompt
    covered: int = 0  # own tokens whose KV the previous turn left behind (prompt + reply)
    turn: int = 0
    last_worker: int | None = None
    moved: bool = False
    token: int = 0  # id of the request in flight (stale completions are ignored)
    out: int = 0
    tool: int = 0
    counted: tuple[int, int, int] = (0, 0, 0)  # (prompt, cached, ideal) of the request in flight


def _cut_lru_tail(entries: OrderedDict, excess: int) -> tuple[tuple, int]:
    """Cut up to ``excess`` tokens from the tail of the least recently used entry (dropped when
    nothing is left of it); returns (its key, tokens cut)."""
    key = next(iter(entries))
    cut = min(entries[key], excess)
    entries[key] -= cut
    if entries[key] == 0:
        del entries[key]
    return key, cut


@dataclass
class Worker:
    id: str
    healthy: bool = True
    in_flight: int = 0
    cache: OrderedDict = field(default_factory=OrderedDict)  # tier 1 (GPU): key -> head tokens
    size: int = 0
    tier2: OrderedDict = field(default_factory=OrderedDict)  # host RAM: key -> the tokens after the head
    size2: int = 0
    running: set = field(default_factory=set)
    joined_at: float = float("-inf")

    def _have(self, key: tuple) -> tuple[int, int]:
        """(tokens of an entry in tier 1, tokens after them in tier 2): the head and its tail."""
        return self.cache.get(key, 0), self.tier2.get(key, 0)

    def lookup(self, agent: int, prefix_len: int, session: int, own: int) -> tuple[int, int]:
        """(cached tokens, of which restored from tier 2) for a prompt of prefix + ``own`` tokens."""
        p1, p2 = self._have(("p", agent))
        if p1 + p2 < prefix_len:
            return p1 + p2, p2  # a chained block cache keeps the head of a chain: the prefix's first blocks
        s1, s2 = self._have(("s", session))
        own_cached = min(own, s1 + s2)
        return prefix_len + own_cached, max(0, prefix_len - p1) + max(0, own_cached - s1)

    def store(
        self, agent: int, prefix_len: int, session: int, own_tokens: int, capacity: int, capacity2: int = 0
    ) -> None:
        for key, size in ((("s", session), own_tokens), (("p", agent), prefix_len)):  # the prefix ends MRU
            self.size += size - self.cache.pop(key, 0)
            self.size2 -= self.tier2.pop(key, 0)  # all of it is in tier 1 now
            self.cache[key] = size
        while self.size > capacity and self.cache:
            # cut the least recently used entry from its tail (a block cache frees a chain's last
            # blocks first and keeps its head); with a tier 2 the cut blocks go there (in front of
            # what it already holds of that entry)
            key, cut = _cut_lru_tail(self.cache, self.size - capacity)
            self.size -= cut
            if capacity2 > 0:
                self.tier2[key] = self.tier2.pop(key, 0) + cut
                self.size2 += cut
        while self.size2 > capacity2 and self.tier2:  # tier 2 is LRU too, cut from the tail
            _, cut = _cut_lru_tail(self.tier2, self.size2 - capacity2)
            self.size2 -= cut

    def wipe(self) -> None:
        self.cache.clear()
        self.tier2.clear()
        self.size = self.size2 = 0


@dataclass
class Workload:
    prefix_len: list[int]
    agent_of: list[int]
    arrivals: list[float]
    turns: list[int]
    seed: int


def make_workload(sessions: int, agents: int, rate: float, seed: int) -> Workload:
    rng = random.Random(seed)
    prefix_len = [rng.randint(2000, 8000) for _ in range(agents)]
    weights = [1.0 / (a + 1) for a in range(agents)]  # Zipf(1)
    agent_of = rng.choices(range(agents), weights, k=sessions)
    t, arrivals = 0.0, []
    for _ in range(sessions):
        t += rng.expovariate(rate)
        arrivals.append(t)
    turns = [max(1, min(60, round(rng.lognormvariate(math.log(8), 0.8)))) for _ in range(sessions)]
    return Workload(prefix_len, agent_of, arrivals, turns, seed)


def simulate(
    policy,
    wl: Workload,
    n_workers: int,
    capacity: int,
    fail: int,
    join: int,
    slow_start_s: float,
    capacity2: int = 0,
) -> dict:
    rng = random.Random(wl.seed + 1)  # same pauses and token counts for every policy
    workers = [Worker(f"w{i}") for i in range(n_workers)]
    sessions = [
        Session(i, wl.agent_of[i], wl.turns[i], rng.randint(50, 500)) for i in range(len(wl.arrivals))
    ]
    draws = {}  # (session, turn) -> (out tokens, tool tokens, pause): identical across policies
    for s in sessions:
        for t in range(s.turns):
            pause = rng.expovariate(1 / 4.0) if rng.random() > 0.1 else rng.uniform(20, 120)
            draws[(s.id, t)] = (
                rng.randint(50, 400),
                max(50, min(8000, round(rng.lognormvariate(math.log(800), 0.9)))),
                pause,
            )
    end = wl.arrivals[-1]
    events: list[tuple[float, int, str, int]] = []
    seq = 0

    def push(at: float, kind: str, arg: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, arg))

    for s in sessions:
        push(wl.arrivals[s.id], "request", s.id)
    failed = list(range(0, n_workers, max(1, n_workers // max(1, fail))))[:fail]
    push(0.3 * end, "fail", 0)
    push(0.5 * end, "join", 0)
    push(0.7 * end, "recover", 0)
    t = 1.0
    while t < end:
        push(t, "sample", 0)
        t += 1.0
    seen_agents: set[int] = set()
    st = {
        "prompt": 0,
        "cached": 0,
        "ideal": 0,
        "turns": 0,
        "moves": 0,
        "ratios": [],
        "means": [],
        "spilled": 0,
        "per_worker": {},
        "lost_first_turn": 0,
        "lost_moved": 0,
        "lost_evicted": 0,
    }

    def dispatch(now: float, s: Session) -> None:
        warm_after = now - slow_start_s
        loads = [WorkerLoad(w.id, w.healthy, w.in_flight, w.joined_at > warm_after) for w in workers]
        sel = policy.select_worker(RouteRequest(f"s{s.id}", f"h:agent{s.agent}", s.turn), loads)
        w = workers[sel.worker]
        st["spilled"] += sel.outcome == "spilled"
        plen = wl.prefix_len[s.agent]
        moved = s.last_worker is not None and s.last_worker != sel.worker
        if moved:
            s.moved = True
            st["moves"] += 1
        s.last_worker = sel.worker
        cached, restored = w.lookup(s.agent, plen, s.id, s.covered)
        ideal = (plen if s.agent in seen_agents else 0) + s.covered
        seen_agents.add(s.agent)
        st["prompt"] += plen + s.own
        st["cached"] += cached
        st["ideal"] += ideal
        s.counted = (plen + s.own, cached, ideal)
        cause = "lost_first_turn" if s.turn == 0 else "lost_moved" if moved else "lost_evicted"
        st[cause] += ideal - cached
        out, tool, _ = draws[(s.id, s.turn)]
        s.out, s.tool = out, tool
        s.token += 1
        w.in_flight += 1
        w.running.add(s.id)
        duration = BASE_S + (plen + s.own - cached) / PREFILL_TOK_S + restored / RESTORE_TOK_S + out * TPOT_S
        push(now + duration, "done", s.id * 1_000_000 + s.token)

    while events:
        now, _, kind, arg = heapq.heappop(events)
        if kind == "request":
            dispatch(now, sessions[arg])
        elif kind == "done":
            s = sessions[arg // 1_000_000]
            if arg % 1_000_000 != s.token:
                continue  # its worker failed: the request was retried elsewhere
            w = workers[s.last_worker]
            w.in_flight -= 1
            w.running.discard(s.id)
            w.store(s.agent, wl.prefix_len[s.agent], s.id, s.own + s.out, capacity, capacity2)
            st["turns"] += 1
            s.covered = s.own + s.out
            s.own += s.out + s.tool
            _, _, pause = draws[(s.id, s.turn)]
            s.turn += 1
            if s.turn < s.turns:
                push(now + pause, "request", s.id)
        elif kind == "sample":
            if 0.1 * end < now:
                live = [w.in_flight for w in workers if w.healthy]
                mean = sum(live) / len(live)
                st["means"].append(mean)
                for w in workers:
                    if w.healthy:
                        acc = st["per_worker"].setdefault(w.id, [0, 0])
                        acc[0] += w.in_flight
                        acc[1] += 1
                if mean > 0:
                    st["ratios"].append(max(live) / mean)
        elif kind == "fail":
            for i in failed:
                w = workers[i]
                w.healthy = False
                w.wipe()
                orphans = sorted(w.running)
                w.running.clear()
                w.in_flight = 0
                for sid in orphans:  # retried at once on the next worker
                    s = sessions[sid]
                    for k, v in zip(("prompt", "cached", "ideal"), s.counted, strict=True):
                        st[k] -= v  # counted again on the retry
                    dispatch(now, s)
        elif kind == "join":
            workers += [Worker(f"w{n_workers + j}", joined_at=now) for j in range(join)]
        elif kind == "recover":
            for i in failed:
                workers[i].healthy, workers[i].joined_at = True, now
    ratios = sorted(st["ratios"])
    avg = [a / n for a, n in st["per_worker"].values() if n]
    return {
        "hit_rate_of_ideal": st["cached"] / max(1, st["ideal"]),
        "cached_of_prompt": st["cached"] / max(1, st["prompt"]),
        "imbalance_mean": sum(ratios) / max(1, len(ratios)),
        "imbalance_time_avg": max(avg) / (sum(avg) / len(avg)),
        "imbalance_p95": ratios[int(0.95 * (len(ratios) - 1))] if ratios else 0.0,
        "moved_sessions": sum(s.moved for s in sessions) / len(sessions),
        "moves_per_1000_turns": 1000 * st["moves"] / max(1, st["turns"]),
        "spills_per_1000_turns": 1000 * st["spilled"] / max(1, st["turns"]),
        "turns": st["turns"],
        **{k: st[k] / max(1, st["ideal"]) for k in ("lost_first_turn", "lost_moved", "lost_evicted")},
        "mean_in_flight_per_worker": sum(st["means"]) / max(1, len(st["means"])),
    }


def registered(
    name: str, eps: float = 2.0, floor: int = 4, eps_new: float | None = None, k: int = 1
) -> RoutingPolicy:
    """A policy as the router builds it: by name, through the registry (``eps_new`` None: one flat
    bound)."""
    settings = RoutingSettings(
        policy=name, load_epsilon=eps, load_floor=floor, load_epsilon_new=eps_new, prefix_spread=k
    )
    return make_policy(settings)


def policies(
    eps: float, eps_new: float, old_eps: float, strict: float, floor: int, spreads: list[int]
) -> list[tuple[str, RoutingPolicy]]:
    """Each rendezvous policy twice: with one flat bound (old_eps: the default before the graded
    bound) and with the turn-graded bound (eps_new doubling per turn up to eps)."""
    graded = f"graded {eps_new:g}x2^turn<={eps:g}"
    out: list[tuple[str, RoutingPolicy]] = []
    pa = "prefix_affinity"
    for k in spreads:
        out += [
            (f"prefix_affinity k={k}, {graded}", registered(pa, eps, floor, eps_new, k)),
            (f"prefix_affinity k={k}, flat eps={old_eps:g}", registered(pa, old_eps, floor, None, k)),
        ]
    out += [
        (f"affinity, {graded}", registered("affinity", eps, floor, eps_new)),
        (f"affinity, flat eps={old_eps:g}", registered("affinity", old_eps, floor)),
        (f"affinity, flat eps={strict:g}", registered("affinity", strict, floor)),
        ("affinity, never spill", registered("affinity", 1e9, floor)),
        (f"prefix only (SGLang-like), {graded}", registered("prefix", eps, floor, eps_new)),
        (f"prefix only (SGLang-like), flat eps={old_eps:g}", registered("prefix", old_eps, floor)),
        ("round_robin", registered("round_robin")),
        ("least_loaded", registered("least_loaded")),
    ]
    return out


def write(results: dict, args: argparse.Namespace, took: float) -> str:
    tier2 = f" + a host-RAM tier 2 of {args.tier2_tokens:,} tokens" if args.tier2_tokens else ""
    lines = [
        "# Fleet simulation: session placement policies",
        "",
        f"`python benchmarks/fleet/fleet_sim.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        "",
        f"{args.workers} workers (LRU prefix cache of {args.cache_tokens:,} tokens each{tier2}), "
        f"{args.sessions:,} sessions of {args.agents} agent types (2-8k-token prefixes, Zipf popularity), "
        f"Poisson arrivals at {args.rate}/s; {args.fail} workers fail at 30% of the window, "
        f"{args.join} join at 50%, the failed come back empty at 70%; slow start {args.slow_start:.0f} s. "
        f"Bounded load: load_floor={args.floor}, load_epsilon as named per row. "
        "Simulated, not measured on GPUs: see the header of benchmarks/fleet/fleet_sim.py. "
        f"Run time {took:.0f} s.",
        "",
        "| policy | **hit rate of ideal** | cached / prompt | **max/mean in-flight**, per 1-s sample: mean "
        "| p95 | max/mean of per-worker average in-flight | sessions moved | moves / 1k turns "
        "| spills / 1k turns | lost: first turns / moves / evictions |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | **{r['hit_rate_of_ideal']:.2%}** | {r['cached_of_prompt']:.2%} | "
            f"**{r['imbalance_mean']:.2f}** | {r['imbalance_p95']:.2f} | {r['imbalance_time_avg']:.2f} | "
            f"{r['moved_sessions']:.1%} | {r['moves_per_1000_turns']:.1f} | "
            f"{r['spills_per_1000_turns']:.1f} | "
            f"{r['lost_first_turn']:.2%} / {r['lost_moved']:.2%} / {r['lost_evicted']:.2%} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (
        ("hit_rate_of_ideal", "hit rate of ideal", 0.98),
        ("imbalance_mean", "max / mean in-flight", 1.3),
        ("moved_sessions", "sessions moved", None),
    )
    for ax, (key, title, goal) in zip(axes, panels, strict=True):
        vals = [results[n][key] for n in names]
        ax.barh(
            names, vals, color=["tab:green" if n.startswith("prefix_affinity") else "tab:gray" for n in names]
        )
        if goal is not None:
            ax.axvline(goal, color="tab:red", linestyle="--", linewidth=1, label=f"goal {goal}")
            ax.legend(loc="lower right")
        ax.set_title(title)
        ax.invert_yaxis()
        if key == "hit_rate_of_ideal":
            ax.set_xlim(min(vals) * 0.95, 1.0)
    for ax in axes[1:]:
        ax.set_yticklabels([])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--sessions", type=int, default=10_000)
    p.add_argument("--agents", type=int, default=50)
    p.add_argument("--rate", type=float, default=40.0, help="new sessions per second")
    p.add_argument("--cache-tokens", type=int, default=1_000_000)
    p.add_argument(
        "--tier2-tokens",
        type=int,
        default=0,
        help="per worker, a host-RAM tier 2 of this many tokens (prefix_cache.tier2; 0 = none, the default)",
    )
    p.add_argument("--only", help="run only the policies whose row name contains one of these (comma list)")
    p.add_argument("--fail", type=int, default=4)
    p.add_argument("--join", type=int, default=4)
    p.add_argument("--slow-start", type=float, default=600.0, help="routing.slow_start_s (0 = off)")
    p.add_argument("--eps", type=float, default=2.0, help="load_epsilon (the graded bound's ceiling)")
    p.add_argument("--eps-new", type=float, default=0.1, help="load_epsilon_new (a first turn's bound)")
    p.add_argument("--old-eps", type=float, default=1.0, help="the flat bound rows (the default before)")
    p.add_argument(
        "--strict-eps", type=float, default=0.25, help="a second, stricter bound for one affinity row"
    )
    p.add_argument("--floor", type=int, default=4)
    p.add_argument("--spread", type=int, action="append", help="prefix_affinity k values (default 32)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=str(RESULTS / "fleet_sim"), help="output path without extension")
    args = p.parse_args()
    spreads = args.spread or [32]
    wl = make_workload(args.sessions, args.agents, args.rate, args.seed)
    t0 = time.time()
    results = {}
    only = [w for w in (args.only or "").split(",") if w]
    for name, policy in policies(args.eps, args.eps_new, args.old_eps, args.strict_eps, args.floor, spreads):
        if only and not any(w in name for w in only):
            continue
        t1 = time.time()
        results[name] = simulate(
            policy,
            wl,
            args.workers,
            args.cache_tokens,
            args.fail,
            args.join,
            args.slow_start,
            args.tier2_tokens,
        )
        print(
            f"{name}: {results[name]['hit_rate_of_ideal']:.2%} of ideal, max/mean "
            f"{results[name]['imbalance_mean']:.2f}, moved {results[name]['moved_sessions']:.1%} "
            f"spills/1k {results[name]['spills_per_1000_turns']:.0f} "
            f"in-flight/worker {results[name]['mean_in_flight_per_worker']:.1f} lost: first "
            f"{results[name]['lost_first_turn']:.2%} moved {results[name]['lost_moved']:.2%} "
            f"evicted {results[name]['lost_evicted']:.2%} "
            f"({time.time() - t1:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    took = time.time() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    md = write(results, args, took)
    out.with_suffix(".md").write_text(md)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")
    plot(results, out.with_suffix(".png"))
    print(md)


if __name__ == "__main__":
    main()
