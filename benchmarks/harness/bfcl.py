"""Tool-call validity on BFCL ``simple`` / ``live_simple`` (public real-world function definitions).

Cases come from the copy in ``benchmarks/data/bfcl`` (bfcl-eval 2026.3.23, Apache-2.0); their
functions are converted as BFCL's OpenAI handler converts them (``benchmarks/harness/bfcl_openai.py``).
Each case is sent once per mode, non-streaming, temperature 0:

- ``auto``: ``tool_choice: "auto"``; ``required``: ``"required"``; ``named``: the case's function
  by name (``{"type": "function", "function": {"name": ...}}``);
- ``subset``: the case's function + ``DISTRACTORS`` other cases' functions, restricted to the
  case's function: ``allowed_tools`` (mode required) where the server enforces it, else (a stock
  server) the client removes the other tools and sends ``required`` -- what each must do.

Each reply is scored (``score``) without altering it:
``valid``     >= 1 complete call (arguments parse as a JSON object) to an allowed tool whose
              arguments validate against the tool's JSON Schema (jsonschema);
``cut``       ``finish_reason == "length"``; ``cut_reported``: the reply names the cut call in
              the ``incomplete_tool_call`` extension;
``parse_fail`` a call whose arguments are not a JSON object;
``not_allowed`` a call to a tool that was not offered / not allowed (the named one in ``named``);
``leak``      call-envelope text (``<tool_call>``, ``[TOOL_CALLS]``, ...) in ``content``;
``no_call``   no tool call at all; ``ok``: valid and no bad call, or cut and reported (issue 12's goal).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.bfcl_openai import convert_to_tool

DATA = Path(__file__).resolve().parents[1] / "data" / "bfcl"
SETS = {"simple": "BFCL_v4_simple_python.json", "live_simple": "BFCL_v4_live_simple.json"}
MODES = ("auto", "required", "named", "subset")
DISTRACTORS = 4
# call-envelope markers of the families agentserve knows (grammars/envelopes) and common others
ENVELOPE_MARKERS = (
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "<|python_tag|>",
    "<function=",
    "</function>",
)
OUTCOMES = ("valid", "cut", "cut_reported", "parse_fail", "not_allowed", "leak", "no_call", "error", "ok")


@dataclass
class Case:
    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]  # OpenAI tools, BFCL's conversion

    @property
    def name(self) -> str:
        return str(self.tools[0]["function"]["name"])


def load_cases(set_name: str, n: int | None = None) -> list[Case]:
    """The cases of one set; ``n`` picks n spread evenly over the file (deterministic)."""
    rows = [json.loads(line) for line in (DATA / SETS[set_name]).read_text().splitlines() if line.strip()]
    if n is not None and n < len(rows):
        step = len(rows) / n
        rows = [rows[int(i * step)] for i in range(n)]
    return [Case(r["id"], list(r["question"][0]), convert_to_tool(r["function"])) for r in rows]


def request(
    case: Case, mode: str, model: str, max_tokens: int, pool: list[Case], allowed_tools: bool
) -> tuple[dict[str, Any], set[str]]:
    """The request body for ``case`` in ``mode`` and the tool names a call may use."""
    body: dict[str, Any] = {
        "model": model,
        "messages": case.messages,
        "temperature": 0,
        "max_tokens": max_tokens,
        "tools": case.tools,
    }
    if mode in ("auto", "required"):
        body["tool_choice"] = mode
    elif mode == "named":
        body["tool_choice"] = {"type": "function", "function": {"name": case.name}}
    elif mode == "subset":
        others = [c.tools[0] for c in _distractors(case, pool)]
        if allowed_tools:
            body["tools"] = [*others[:2], *case.tools, *others[2:]]
            body["tool_choice"] = {
                "type": "allowed_tools",
                "allowed_tools": {"mode": "required", "tools": [{"type": "function", "name": case.name}]},
            }
        else:  # a stock server: the client removes the tools it does not allow
            body["tool_choice"] = "required"
    else:
        raise ValueError(f"unknown mode {mode!r}: choose from {', '.join(MODES)}")
    return body, {case.name}


def _distractors(case: Case, pool: list[Case]) -> list[Case]:
    others = [c for c in pool if c.name != case.name]
    if not others:
        return []
    start = sum(map(ord, case.id)) % len(others)
    # distinct names: several cases share a function (e.g. live_simple's Weather_1_GetWeather), and a
    # request with two tools of one name is a 400 (names must be unique), not a tool-calling outcome
    picked: list[Case] = []
    for i in range(len(others)):
        c = others[(start + i) % len(others)]
        if all(c.name != p.name for p in picked):
            picked.append(c)
            if len(picked) == DISTRACTORS:
                break
    return picked


def _validator(tool: dict[str, Any]):
    import jsonschema

    schema = tool["function"].get("parameters") or {"type": "object"}
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def score(
    reply: dict[str, Any] | None, status: int, tools: list[dict[str, Any]], allowed: set[str]
) -> dict[str, Any]:
    """One reply -> its outcome flags (see the module docstring). Never alters the reply."""
    out: dict[str, Any] = dict.fromkeys(OUTCOMES, False)
    out.update(status=status, finish=None, calls=0, detail="")
    if status != 200 or not reply or not reply.get("choices"):
        out["error"] = True
        out["detail"] = json.dumps(reply)[:200] if reply else f"HTTP {status}"
        return out
    choice = reply["choices"][0]
    msg = choice.get("message") or {}
    out["finish"] = choice.get("finish_reason")
    out["cut"] = out["finish"] == "length"
    out["cut_reported"] = bool(choice.get("incomplete_tool_call"))
    content = msg.get("content") or ""
    out["leak"] = any(m in content for m in ENVELOPE_MARKERS)
    out["content"] = content[:200]  # kept so a leak can be read in the results
    calls = msg.get("tool_calls") or []
    out["calls"] = len(calls)
    # kept so an invalid call can be read in the results
    out["call_text"] = [
        f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments')})"[:400]
        for c in calls
    ]
    out["no_call"] = not calls
    by_name = {t["function"]["name"]: t for t in tools}
    problems = []
    for c in calls:
        fn = c.get("function") or {}
        name = fn.get("name")
        try:
            args = json.loads(fn.get("arguments") or "")
        except (json.JSONDecodeError, TypeError):
            args = None
        if not isinstance(args, dict):
            out["parse_fail"] = True
            problems.append(f"{name}: arguments do not parse")
            continue
        if name not in allowed or name not in by_name:
            out["not_allowed"] = True
            problems.append(f"{name}: not allowed")
            continue
        errors = sorted(e.message for e in _validator(by_name[name]).iter_errors(args))
        if errors:
            problems.append(f"{name}: {errors[0][:120]}")
        else:
            out["valid"] = True
    out["detail"] = "; ".join(problems)[:300]
    bad = out["parse_fail"] or out["not_allowed"] or out["leak"]
    out["ok"] = bool((out["valid"] and not bad) or (out["cut"] and out["cut_reported"] and not out["leak"]))
    return out


async def _run(
    url: str,
    model: str,
    cases: list[Case],
    modes: list[str],
    max_tokens: int,
    allowed_tools: bool,
    label: str,
    progress: bool,
    timeout_s: float,
    concurrency: int = 1,
) -> list[dict[str, Any]]:
    from tqdm import tqdm

    bar = tqdm(
        total=len(cases) * len(modes), desc=f"{label} bfcl", unit="req", file=sys.stderr, disable=not progress
    )
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(client: httpx.AsyncClient, case: Case, mode: str) -> dict[str, Any]:
        body, allowed = request(case, mode, model, max_tokens, cases, allowed_tools)
        async with gate:
            t0 = time.perf_counter()
            try:
                r = await client.post(url + "/v1/chat/completions", json=body)
                status, reply = r.status_code, _json(r)
            except httpx.HTTPError as exc:
                status, reply = 0, {"error": f"{type(exc).__name__}: {exc}"}
            total_s = time.perf_counter() - t0
        rec = score(reply, status, body["tools"], allowed)
        usage = (reply or {}).get("usage") or {}
        rec.update(
            label=label,
            mode=mode,
            case=case.id,
            total_s=total_s,
            completion_tokens=usage.get("completion_tokens"),
        )
        bar.update(1)
        return rec

    # records in request order (mode by mode, case by case) whatever the concurrency
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0)) as client:
        records = await asyncio.gather(*(one(client, case, mode) for mode in modes for case in cases))
    bar.close()
    return list(records)


def _json(r: httpx.Response) -> dict[str, Any] | None:
    try:
        data = r.json()
    except ValueError:
        return {"error": r.text[:300]}
    return data if isinstance(data, dict) else None


def run_bfcl(url: str, model: str, cases: list[Case], modes: list[str], **kw: Any) -> list[dict[str, Any]]:
    """Send every case in every mode to ``url``; one scored record per request, in request order.
    ``concurrency`` (default 1): requests in flight at once (a batching server serves them together;
    at temperature 0 the replies should not change, only the time)."""
    kw.setdefault("max_tokens", 128)
    kw.setdefault("allowed_tools", False)
    kw.setdefault("label", "server")
    kw.setdefault("progress", True)
    kw.setdefault("timeout_s", 600.0)
    kw.setdefault("concurrency", 1)
    return asyncio.run(_run(url, model, cases, modes, **kw))


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (label, mode): the share of requests with each outcome."""
    keys: list[tuple[str, str]] = []
    for r in records:
        if (r["label"], r["mode"]) not in keys:
            keys.append((r["label"], r["mode"]))
    rows = []
    for label, mode in keys:
        rs = [r for r in records if r["label"] == label and r["mode"] == mode]
        row: dict[str, Any] = {"label": label, "mode": mode, "n": len(rs)}
        for k in OUTCOMES:
            row[k] = sum(bool(r[k]) for r in rs) / len(rs)
        row["median_s"] = sorted(r["total_s"] for r in rs)[len(rs) // 2]
        rows.append(row)
    return rows
