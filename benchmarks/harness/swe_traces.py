"""Replay real SWE-agent trajectories (benchmarks/traces/swe-agent, MIT licence beside them).

A ``.traj`` file's ``history`` is the message list the agent sent, in OpenAI shape, plus
SWE-agent's own keys (``message_type``, ``agent``, ``thought``, ``action``, ...) which
are dropped here. Tools come from the YAML bundles the run used (replay_config ->
agent.tools.bundles) plus SWE-agent's ``bash`` tool, converted to OpenAI tool entries.

Fitting a context window, deterministically:
1. every observation longer than ``max_obs_chars`` keeps its first 70 % and last 30 %
   of that many characters around a line ``[... N characters truncated ...]``;
2. if a turn's prompt still does not fit ``context - reserve`` tokens, the replay
   STOPS before that turn. ``Session.notes`` says what was truncated and where it stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from benchmarks.harness.trace_gen import PromptTokens, Session, Turn

TRACE_DIR = Path(__file__).resolve().parents[1] / "traces" / "swe-agent"
TRACES = ("marshmallow-1867.function_calling.traj", "marshmallow-1867.function_calling_replace.traj")
# SWE-agent bundle path (replay_config) -> our copy of its tools YAML
BUNDLE_FILES = {
    "tools/defaults": "windowed.yaml",
    "tools/windowed": "windowed.yaml",
    "tools/search": "search.yaml",
    "tools/edit_linting": "windowed_edit_linting.yaml",
    "tools/windowed_edit_linting": "windowed_edit_linting.yaml",
    "tools/edit_replace": "windowed_edit_replace.yaml",
    "tools/windowed_edit_replace": "windowed_edit_replace.yaml",
    "tools/submit": "submit.yaml",
    "tools/web_browser": "web_browser.yaml",
}
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "runs the given command directly in bash",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to execute."}},
            "required": ["command"],
        },
    },
}
_KEEP = ("role", "content", "tool_calls", "tool_call_id", "name")


def tools_from_yaml(path: Path) -> list[dict[str, Any]]:
    """SWE-agent tool YAML -> OpenAI tools, the shape SWE-agent's function-calling mode sends:
    description = the docstring (whitespace folded), parameters = an object schema with one
    property per argument (type, description, enum, items) and ``required`` (always present).
    The only converter: tests/fixtures/make_swe_agent_tools.py writes the fixtures with it."""
    doc = yaml.safe_load(path.read_text())
    out = []
    for name, spec in (doc.get("tools") or {}).items():
        props: dict[str, Any] = {}
        required = []
        for arg in spec.get("arguments") or []:
            schema: dict[str, Any] = {
                "type": arg.get("type", "string"),
                "description": arg.get("description", ""),
            }
            if arg.get("enum"):
                schema["enum"] = list(arg["enum"])
            if schema["type"] == "array":
                schema["items"] = arg.get("items") or {"type": "string"}
            props[arg["name"]] = schema
            if arg.get("required"):
                required.append(arg["name"])
        params: dict[str, Any] = {"type": "object", "properties": props, "required": required}
        desc = " ".join(str(spec.get("docstring", "")).split())
        out.append(
            {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}
        )
    return out


def _clean(msg: dict[str, Any]) -> dict[str, Any]:
    out = {k: msg[k] for k in _KEEP if k in msg and msg[k] is not None}
    if msg.get("role") == "tool" and "tool_call_id" not in out and msg.get("tool_call_ids"):
        out["tool_call_id"] = msg["tool_call_ids"][0]
    if isinstance(out.get("content"), list):  # [{"type": "text", "text": ...}] -> str
        out["content"] = "".join(p.get("text", "") for p in out["content"] if isinstance(p, dict))
    if "tool_calls" in out:
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
            }
            for c in out["tool_calls"]
        ]
    return out


def truncate_observation(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    head = int(max_chars * 0.7)
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters truncated ...]\n{text[len(text) - tail :]}"


def load_trace(
    name: str,
    *,
    context: int = 8192,
    reserve: int = 256,
    max_obs_chars: int = 3000,
    prompt_tokens: PromptTokens | None = None,
    trace_dir: Path = TRACE_DIR,
) -> Session:
    """One SWE-agent trajectory as a replayable Session (one turn per assistant message)."""
    doc = json.loads((trace_dir / name).read_text())
    rc = doc.get("replay_config")
    rc = json.loads(rc) if isinstance(rc, str) else (rc or {})
    tool_cfg = rc.get("agent", {}).get("tools", {})
    tools: list[dict[str, Any]] = []
    for bundle in tool_cfg.get("bundles", []):
        f = BUNDLE_FILES.get(bundle["path"])
        if f:
            tools.extend(tools_from_yaml(trace_dir / "tools" / f))
    if tool_cfg.get("enable_bash_tool", True):
        tools.append(BASH_TOOL)
    messages = []
    truncated = 0
    for m in doc["history"]:
        msg = _clean(m)
        if msg["role"] == "tool" and isinstance(msg.get("content"), str):
            new = truncate_observation(msg["content"], max_obs_chars)
            truncated += new != msg["content"]
            msg["content"] = new
        messages.append(msg)
    turns: list[Turn] = []
    stopped = ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        if prompt_tokens is not None:
            size = prompt_tokens(messages[:i], tools)
            if size > context - reserve:
                stopped = f"; stopped before turn {len(turns) + 1}: {size} > {context - reserve} tokens"
                break
        turns.append(Turn(len(turns) + 1, i, ""))
    notes = (
        f"SWE-agent {name}: {len(turns)} turns; {truncated} observations cut to {max_obs_chars} characters "
        f"(head 70 % + tail 30 %)" + stopped
    )
    return Session(
        session_id=f"swe-{name.split('.')[1]}",
        messages=messages,
        tools=tools,
        turns=turns,
        source=f"swe-agent:{name}",
        notes=notes,
        meta={"context": context, "max_obs_chars": max_obs_chars},
    )


def load_traces(**kw: Any) -> list[Session]:
    return [load_trace(n, **kw) for n in TRACES]
