"""Build diagnosis inputs the way the service does: render, tokenize (real tokenizer), fingerprint."""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

from server.cache_diag import CacheState, Prompt, diagnose, fingerprint
from server.families.envelope import load_envelope
from server.families.render import renderer_for
from server.protocol import ChatMessage

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ENV = load_envelope("hermes")
SETTINGS = {"cache_namespace": "", "tool_state_machine": "agent", "envelope": "hermes"}


def prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    settings: dict[str, Any] | None = None,
    model: str = "smollm2-135m-instruct",
    rendered_messages: list[dict[str, Any]] | None = None,
    family: str = "hermes",
) -> Prompt:
    """``rendered_messages``: what the template renders, when it differs from what the client sent."""
    shown = rendered_messages if rendered_messages is not None else messages
    rendered = renderer_for(family).render([ChatMessage.model_validate(m) for m in shown], tools)
    enc = tokenizer(rendered.text, add_special_tokens=False, return_offsets_mapping=True)
    ids = array("l", enc["input_ids"])
    offsets = array("l", (s for s, _ in enc["offset_mapping"]))
    fp = fingerprint(
        model=model,
        settings=settings if settings is not None else SETTINGS,
        ids=ids,
        offsets=offsets,
        rendered=rendered,
        messages=messages,
        tools=tools or [],
    )
    return Prompt(fp, ids, rendered.text, offsets)


def hashed(p: Prompt) -> Prompt:
    """The same prompt as the per-response store keeps it: fingerprint only."""
    return Prompt(p.fp)


def ideal_cached(prev: Prompt, cur: Prompt, block: int = 32) -> int:
    """What a cache holding the previous prompt serves for the current one (no eviction)."""
    lcp = 0
    a, b = prev.ids or [], cur.ids or []
    while lcp < min(len(a), len(b)) and a[lcp] == b[lcp]:
        lcp += 1
    return (min(lcp, len(b) - 1) // block) * block


def run(prev: Prompt, cur: Prompt, cached: int | None = None, block: int = 32, idle: float = 5.0, **kw: Any):
    """Diagnose ``cur`` against ``prev``; by default the cache served all it held of ``prev``."""
    if cached is None:
        cached = ideal_cached(prev, cur, block)
    return diagnose(prev, cur, CacheState(cached, block, **kw), idle_s=idle)


def tool(name: str, desc: str = "") -> dict[str, Any]:
    fn: dict[str, Any] = {
        "name": name,
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    }
    if desc:
        fn["description"] = desc
    return {"type": "function", "function": fn}


def trace_bodies(name: str) -> list[list[dict[str, Any]]]:
    """Per session of a set in tests/fixtures/agent_traces.json: the request bodies of its turns
    (append-only, tools fixed: the good practice)."""
    out = []
    for s in json.loads((FIXTURES / "agent_traces.json").read_text())[name]:
        tools = s["tools"]
        if isinstance(tools, str):
            tools = json.loads((FIXTURES / tools).read_text())
        out.append(
            [{"messages": [dict(m) for m in s["messages"][:end]], "tools": tools} for end in s["ends"]]
        )
    return out
