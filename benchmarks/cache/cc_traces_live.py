"""agentserve bench traces --mode live: the Claude Code traces replayed against running servers.

Each ``--url [NAME=]URL`` is one *arm*; the arms run one after another in one invocation, on
the same scaled traces and the same schedule, so their rows compare side by side.

Scale (a 64-token trace block is far too big for a CPU box; the output says the scale):
- a trace block (hash id ``h`` of trace ``k``) becomes ``--tokens-per-block K`` words, each one
  token of the common tokenizers with its leading space (`` the``-style), drawn from ``WORDS`` by
  a hash of (k, h, j): the same id gives the same text, so the same tokens, wherever it sits
  (every word starts a pre-token, so a block's tokens never merge with its neighbours'). The
  prompt of a request is its blocks' texts joined, sent raw to ``/v1/completions`` (no chat
  template: every OpenAI-compatible server serves it alike); the server's ``usage.prompt_tokens``
  is checked against ``blocks x K`` (``token_mismatch`` counts the requests that differ);
- main traces only (no sub-agents), ``--max-requests`` per trace; of a prompt's blocks every
  ``--block-stride``-th is kept (positions 0, S, 2S, ...: two prompts that share a prefix still
  share it, to within S blocks), then cut to the first ``--max-blocks`` (a prefix of a prefix is
  a prefix: the reuse structure holds, but prompts longer than the cut look alike);
- timing: ``--users`` traces at once (the next starts when one ends); within a trace, closed
  loop: a request is sent when the previous reply has ended plus the recorded pause (``t`` of
  this request - ``t`` + ``api_time`` of the previous) x ``--time-scale``, at most ``--max-gap-s``.

Each request streams, ``max_tokens`` = min(recorded ``out``, ``--max-tokens``), with the trace's
name as its session (header ``X-Session-ID``: agentserve's session key; other servers ignore it).
``--hints on`` (``both``: every arm without, then with) adds a retention hint of ``--hint-s``
recorded seconds (default 300: Claude Code's 5-minute ``cache_control``) x ``--time-scale``, as
agentserve's ``cache_retention_s`` (what a ``cache_control`` ttl becomes; other servers ignore
it); the hinted pass has its own block texts and session ids (``LiveConfig.salt``,
``session``), so it finds nothing the unhinted pass left cached or knew of its sessions.
Without a hint or tools, agentserve's vLLM engine holds nothing (its session hold is for agent
turns: ``server/engines/vllm/startup.py`` ``hold_seconds``), so ``off`` measures vLLM's LRU on
both vLLM arms.
Per request: prompt tokens and cached tokens from the last chunk's ``usage``
(``prompt_tokens_details.cached_tokens``; stock vLLM needs ``--enable-prompt-tokens-details``),
TTFT = the time to the first chunk carrying text. A request is *returning* when its recorded
pause was at least ``--returning-s`` (recorded seconds, default 60).

``ceiling`` = the share of the scaled prompts' tokens an infinite prefix cache serves (the
longest prefix of a request's blocks that an earlier request of its trace had), ``hit`` =
cached / prompt tokens as the server reports them, ``hit_share_of_ceiling`` = hit / ceiling.
The servers' KV capacity is theirs to set (same tokens for every arm: ``--kv-tokens`` only
records it in the output); ``benchmarks/cache/cc_traces_live_arms.sh`` starts the three CPU arms.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import httpx

from benchmarks.cache.cc_traces import HINT_PASSES, Trace, ceiling_units, load_traces, parse_range

# single tokens with their leading space in SmolLM2's (GPT-2 style) tokenizer: checked live by
# usage.prompt_tokens == blocks x K
WORDS = tuple(
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book eye "
    "job word business issue side kind head house service friend father power hour game line end "
    "member law car city community name president team minute idea kid body information back parent "
    "face others level office door health person art war history party result change morning reason "
    "research girl guy moment air teacher force education foot boy age policy process music market "
    "sense nation plan college interest death experience effect use class control care field "
    "development role effort rate heart drug show leader light voice wife police mind price report "
    "decision son view relationship town road arm difference value building action model season "
    "society tax director position player record paper space ground form event official matter "
    "center couple site project activity star table need court oil situation cost industry figure "
    "street image phase stock".split()
)


@lru_cache(maxsize=1 << 20)
def block_text(unit: int, k: int, salt: bytes = b"") -> str:
    """K words for one trace block (``unit`` = trace index << 32 | hash id): same unit, same text.
    Another ``salt`` gives other texts (a second pass on the same servers shares nothing cached)."""
    raw = unit.to_bytes(16, "little", signed=False)
    digest = hashlib.blake2b(raw, digest_size=2 * k, key=salt).digest()
    return "".join(
        " " + WORDS[int.from_bytes(digest[2 * j : 2 * j + 2], "little") % len(WORDS)] for j in range(k)
    )


def prompt_text(units: Sequence[int], k: int, salt: bytes = b"") -> str:
    return "".join(block_text(u, k, salt) for u in units)


@dataclass
class LiveConfig:
    users: int = 4
    time_scale: float = 0.05
    tokens_per_block: int = 2
    block_stride: int = 1
    max_requests: int = 20
    max_blocks: int = 600
    max_gap_s: float = 10.0
    max_tokens: int = 8
    returning_s: float = 60.0
    timeout_s: float = 600.0
    kv_tokens: int | None = None
    server_block: int = 0  # > 0: also report the ceiling of a server caching whole blocks of this
    hint_s: float = 0.0  # > 0: every request asks the KV be kept this long (recorded s) after its reply

    def scale(self) -> str:
        return (
            f"1 trace block (64 tokens) = {self.tokens_per_block} tokens, every {self.block_stride}th block"
            f" kept; <= {self.max_requests} requests"
            f" per trace; prompts cut to {self.max_blocks} blocks; pauses x {self.time_scale:g},"
            f" <= {self.max_gap_s:g} s; {self.users} users"
        )

    def salt(self) -> bytes:
        """The hinted pass gets its own block texts: after an unhinted pass on the same servers
        (``--hints both``) it must find none of that pass's KV cached."""
        return b"hinted" if self.hint_s > 0 else b""

    def session(self, trace: str) -> str:
        """The session id a trace's requests carry (the hinted pass's own: no state carries over)."""
        return f"{trace}-hinted" if self.hint_s > 0 else trace

    def retention_s(self) -> float:
        """The hint as sent: recorded seconds x the time scale (the pauses it covers are scaled)."""
        return round(self.hint_s * self.time_scale, 3)


@dataclass(frozen=True)
class LiveRequest:
    units: tuple[int, ...]
    pause_s: float  # recorded pause before it (0 for a trace's first request)
    out_tokens: int


@dataclass(frozen=True)
class LiveTrace:
    name: str
    requests: tuple[LiveRequest, ...]
    ceiling_blocks: int

    def ceiling_prefixes(self) -> list[int]:
        """Per request, in order, the blocks an infinite cache serves (the longest prefix of its
        blocks an earlier request of the trace had): they sum to ``ceiling_blocks``."""
        seen: set[int] = set()
        out = []
        for r in self.requests:
            key, n, matched = 0, 0, True
            for u in r.units:  # chained, as ceiling_units and block hashes are
                key = hash((key, u))
                if matched and key in seen:
                    n += 1
                else:
                    matched = False
                    seen.add(key)
            out.append(n)
        return out


def block_ceiling_tokens(traces: Sequence[LiveTrace], k: int, block: int) -> int:
    """The ceiling of a server that caches whole ``block``-token blocks and computes at least the
    prompt's last token (vLLM): per request, min(prefix, prompt - 1) rounded down to a block."""
    total = 0
    for t in traces:
        for r, n in zip(t.requests, t.ceiling_prefixes(), strict=True):
            total += min(n * k, len(r.units) * k - 1) // block * block
    return total


def scale_traces(traces: Sequence[Trace], raw_out: dict[str, list[int]], cfg: LiveConfig) -> list[LiveTrace]:
    """Main traces only, at most ``max_requests`` each, prompts cut to ``max_blocks`` blocks."""
    out = []
    for tr in traces:
        if "/" in tr.name:
            continue
        reqs = tr.requests[: cfg.max_requests]
        cut = tuple(
            type(r)(r.t, r.units[:: cfg.block_stride][: cfg.max_blocks], r.api_s, r.tool_call) for r in reqs
        )
        outs = raw_out.get(tr.name, [])
        live = []
        for i, r in enumerate(cut):
            pause = max(0.0, r.t - (cut[i - 1].t + cut[i - 1].api_s)) if i else 0.0
            live.append(LiveRequest(r.units, pause, outs[i] if i < len(outs) else cfg.max_tokens))
        out.append(LiveTrace(tr.name, tuple(live), ceiling_units(Trace(tr.name, cut))))
    return out


def recorded_out(folder: Path, first: int, last: int) -> dict[str, list[int]]:
    """Per main trace, the recorded ``out`` tokens of its requests that have hash ids."""
    from benchmarks.cache.cc_traces import trace_files

    res = {}
    for _, p in trace_files(folder, first, last):
        raw = json.loads(p.read_text()).get("requests", [])
        res[p.stem] = [int(r.get("out") or 1) for r in raw if r.get("type") != "subagent" and "hash_ids" in r]
    return res


@dataclass
class Record:
    trace: str
    index: int
    blocks: int
    returning: bool
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None
    error: str | None = None


@dataclass
class Arm:
    name: str
    url: str
    records: list[Record] = field(default_factory=list)


async def send(
    client: httpx.AsyncClient, url: str, model: str, trace: LiveTrace, i: int, cfg: LiveConfig
) -> Record:
    req = trace.requests[i]
    rec = Record(trace.name, i, len(req.units), i > 0 and req.pause_s >= cfg.returning_s)
    body = {
        "model": model,
        "prompt": prompt_text(req.units, cfg.tokens_per_block, cfg.salt()),
        "max_tokens": max(1, min(req.out_tokens, cfg.max_tokens)),
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.hint_s > 0:  # agentserve's spelling of a retention hint (what cache_control ttl becomes)
        body["cache_retention_s"] = cfg.retention_s()
    t0 = time.perf_counter()
    try:
        async with client.stream(
            "POST", url + "/v1/completions", json=body, headers={"X-Session-ID": cfg.session(trace.name)}
        ) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if rec.ttft_s is None and any(c.get("text") for c in chunk.get("choices") or ()):
                    rec.ttft_s = time.perf_counter() - t0
                usage = chunk.get("usage")
                if usage:
                    rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    cached = details.get("cached_tokens")
                    rec.cached_tokens = int(cached) if cached is not None else None
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        rec.error = f"{type(e).__name__}: {e}"
        return rec
    if rec.prompt_tokens is None:
        rec.error = "no usage in the stream"
    elif rec.cached_tokens is None:
        rec.error = (
            "no usage.prompt_tokens_details.cached_tokens (stock vLLM: --enable-prompt-tokens-details)"
        )
    return rec


async def run_arm(
    arm: Arm, traces: Sequence[LiveTrace], cfg: LiveConfig, client: httpx.AsyncClient | None = None
) -> dict[str, Any]:
    own = client is None
    client = client or httpx.AsyncClient(timeout=cfg.timeout_s)
    try:
        models = (await client.get(arm.url + "/v1/models")).json()["data"]
        model = str(models[0]["id"])
        users = asyncio.Semaphore(cfg.users)

        async def one(trace: LiveTrace) -> None:
            async with users:
                for i, req in enumerate(trace.requests):
                    if i:
                        await asyncio.sleep(min(req.pause_s * cfg.time_scale, cfg.max_gap_s))
                    arm.records.append(await send(client, arm.url, model, trace, i, cfg))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(t) for t in traces))
        wall = time.perf_counter() - t0
    finally:
        if own:
            await client.aclose()
    return summarize(arm, traces, cfg, model, wall)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s), max(1, math.ceil(q * len(s)))) - 1]


def _ms(v: float | None) -> float | None:
    return round(v * 1000, 1) if v is not None else None


def summarize(
    arm: Arm, traces: Sequence[LiveTrace], cfg: LiveConfig, model: str, wall_s: float
) -> dict[str, Any]:
    k = cfg.tokens_per_block
    ok = [r for r in arm.records if r.error is None]
    blocks = sum(len(q.units) for t in traces for q in t.requests)
    ceiling = sum(t.ceiling_blocks for t in traces) / blocks if blocks else 0.0
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    hit = cached / prompt if prompt else 0.0
    ret = [r for r in ok if r.returning]
    ret_prompt = sum(r.prompt_tokens or 0 for r in ret)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    ret_ttft = [r.ttft_s for r in ret if r.ttft_s is not None]
    errors = [r for r in arm.records if r.error is not None]
    return {
        "arm": arm.name,
        "url": arm.url,
        "model": model,
        "mode": "live",
        "scale": cfg.scale(),
        "tokens_per_block": k,
        "kv_tokens": cfg.kv_tokens,
        "traces": len(traces),
        "requests": len(arm.records),
        "errors": len(errors),
        "first_error": errors[0].error if errors else None,
        "prompt_tokens": prompt,
        "block_tokens": sum(r.blocks for r in ok) * k,
        "token_mismatch": sum(1 for r in ok if r.prompt_tokens != r.blocks * k),
        "cached_tokens": cached,
        "ceiling": round(ceiling, 5),
        "hit": round(hit, 5),
        "hit_share_of_ceiling": round(hit / ceiling, 5) if ceiling else None,
        **_block_ceiling(traces, cfg, blocks),
        "returning_requests": len(ret),
        "returning_hit": round(sum(r.cached_tokens or 0 for r in ret) / ret_prompt, 5)
        if ret_prompt
        else None,
        "ttft_p50_ms": _ms(percentile(ttft, 0.5)),
        "ttft_p99_ms": _ms(percentile(ttft, 0.99)),
        "returning_ttft_p50_ms": _ms(percentile(ret_ttft, 0.5)),
        "returning_ttft_p99_ms": _ms(percentile(ret_ttft, 0.99)),
        "wall_s": round(wall_s, 1),
    }


def _block_ceiling(traces: Sequence[LiveTrace], cfg: LiveConfig, blocks: int) -> dict[str, Any]:
    if not cfg.server_block or not blocks:
        return {}
    c = block_ceiling_tokens(traces, cfg.tokens_per_block, cfg.server_block) / (blocks * cfg.tokens_per_block)
    return {"server_block": cfg.server_block, "block_ceiling": round(c, 5)}


def parse_urls(urls: Sequence[str]) -> list[Arm]:
    arms = []
    for u in urls:
        name, sep, url = u.partition("=")
        if not sep:
            name, url = u.split("//")[-1], u
        arms.append(Arm(name, url.rstrip("/")))
    return arms


def main_live(args: argparse.Namespace) -> int:
    """``--mode live``: one JSON object per arm, each printed as it ends (the last lines)."""
    import sys

    if not args.url:
        print("--mode live needs --url [NAME=]URL (one per server)", file=sys.stderr)
        return 2
    first, last = parse_range(args.range)
    folder = Path(args.traces)
    cfg = LiveConfig(
        users=args.users,
        time_scale=args.time_scale,
        tokens_per_block=args.tokens_per_block,
        block_stride=args.block_stride,
        max_requests=args.max_requests,
        max_blocks=args.max_blocks,
        max_gap_s=args.max_gap_s,
        max_tokens=args.max_tokens,
        returning_s=args.returning_s,
        kv_tokens=args.kv_tokens,
        server_block=args.server_block,
    )
    traces = scale_traces(load_traces(folder, first, last), recorded_out(folder, first, last), cfg)
    if not traces:
        print(f"no trace_NNNN.json in {args.traces} (range {args.range or 'all'})", file=sys.stderr)
        return 2
    hints = [args.hint_s if hinted else 0.0 for hinted in HINT_PASSES[args.hints]]
    for hint_s, arm in ((h, a) for h in hints for a in parse_urls(args.url)):
        run_cfg = replace(cfg, hint_s=hint_s)
        out = asyncio.run(run_arm(arm, traces, run_cfg))
        out["range"] = args.range or "all"
        out["hint_s"], out["retention_s_sent"] = hint_s, run_cfg.retention_s()
        line = json.dumps(out)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")
        print(line, flush=True)
    return 0
