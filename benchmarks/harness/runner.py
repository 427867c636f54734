"""Drive sessions against an OpenAI-compatible server and record every request.

One ``Job`` is one session replayed under one label (variant, cache setting, policy):
its turns go in order on one session key (``prompt_cache_key``); up to
``concurrency`` jobs run at once. Per request we record:

- ``ttft_s``: request sent -> first streamed chunk that carries generated output
  (content or tool-call delta, or the finish chunk if the output was empty). The
  role chunk the server sends before prefill does not count.
- ``total_s``, ``prompt_tokens``, ``cached_tokens``, ``completion_tokens`` (usage of the
  last chunk, ``stream_options.include_usage``), ``worker`` (``X-Agentserve-Worker``
  response header behind the router, else null), ``cache`` (the server's report:
  ``diverged_at_token``, ``reason``), ``status`` and ``error``.

A request that fails (HTTP error, SSE error event) is recorded and ends its job: the
next turns would not be meaningful. The model's replies are discarded: the next turn
sends the recorded trace, as a replay does.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx

from benchmarks.harness.trace_gen import Session
from benchmarks.harness.variants import RequestSpec

WORKER_HEADER = "x-agentserve-worker"


@dataclass
class Job:
    label: str
    session: Session
    requests: list[RequestSpec]
    key: str  # session key (prompt_cache_key)


def _first_output(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices")
    if not choices:
        return "usage" in chunk
    c = choices[0]
    delta = c.get("delta") or {}
    return bool(delta.get("content") or delta.get("tool_calls") or c.get("text") or c.get("finish_reason"))


async def timed_request(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "ttft_s": None,
        "total_s": None,
        "prompt_tokens": None,
        "cached_tokens": None,
        "completion_tokens": None,
        "worker": None,
        "cache": None,
        "status": None,
        "error": None,
    }
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            rec["status"] = r.status_code
            rec["worker"] = r.headers.get(WORKER_HEADER)
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                rec["error"] = _error_message(text) or f"HTTP {r.status_code}"
                return rec
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    rec["error"] = _error_message(line[6:]) or "stream error"
                    break
                if rec["ttft_s"] is None and _first_output(chunk):
                    rec["ttft_s"] = time.perf_counter() - t0
                if chunk.get("cache"):
                    rec["cache"] = chunk["cache"]
                if chunk.get("usage"):
                    u = chunk["usage"]
                    rec["prompt_tokens"] = u.get("prompt_tokens")
                    rec["completion_tokens"] = u.get("completion_tokens")
                    rec["cached_tokens"] = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
    except httpx.HTTPError as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["total_s"] = time.perf_counter() - t0
    if rec["cached_tokens"] is None and rec["cache"]:  # servers that send the report but no usage
        rec["cached_tokens"] = rec["cache"].get("cached_tokens")
        rec["prompt_tokens"] = rec["cache"].get("prompt_tokens")
    return rec


def _error_message(text: str) -> str | None:
    try:
        err = json.loads(text).get("error")
    except (json.JSONDecodeError, AttributeError):
        return text[:300] or None
    return (err.get("message") if isinstance(err, dict) else str(err))[:300] if err else None


def request_body(
    job: Job, spec: RequestSpec, model: str, max_tokens: int, extra_body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The streamed, greedy request of one turn of a job (usage included, the job's session key)."""
    return {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "temperature": 0,
        "prompt_cache_key": job.key,
        **(extra_body or {}),
        **spec.body,
    }


async def run_jobs(
    url: str,
    jobs: list[Job],
    *,
    model: str,
    concurrency: int = 1,
    max_tokens: int = 4,
    turns: set[int] | None = None,
    timeout_s: float = 900.0,
    progress: bool = True,
    extra_body: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Replay ``jobs`` (only ``turns`` of each when given); returns one record per request sent."""
    from tqdm import tqdm

    total = sum(sum(1 for r in j.requests if turns is None or r.turn in turns) for j in jobs)
    bar = tqdm(
        total=total,
        desc=", ".join(sorted({j.label for j in jobs}))[:40],
        unit="req",
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
    )
    records: list[dict[str, Any]] = []
    sem = asyncio.Semaphore(max(1, concurrency))
    limits = httpx.Limits(max_connections=max(4, concurrency * 2))

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits) as client:

        async def one(job: Job) -> None:
            async with sem:
                for spec in job.requests:
                    if turns is not None and spec.turn not in turns:
                        continue
                    body = request_body(job, spec, model, max_tokens, extra_body)
                    rec = await timed_request(client, url, body)
                    rec.update(
                        label=job.label, session=job.session.session_id, turn=spec.turn, t_end=time.time()
                    )
                    records.append(rec)
                    bar.update(1)
                    if rec["error"]:
                        bar.write(f"{job.label} {job.session.session_id} turn {spec.turn}: {rec['error']}")
                        break

        await asyncio.gather(*(one(j) for j in jobs))
    bar.close()
    return records


def run_jobs_sync(url: str, jobs: list[Job], **kw: Any) -> list[dict[str, Any]]:
    return asyncio.run(run_jobs(url, jobs, **kw))
