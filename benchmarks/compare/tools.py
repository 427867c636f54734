"""``bench tools``: the tool list restricted mid-session: mask (allowed_tools) vs remove vs keep."""

from __future__ import annotations

import argparse

from benchmarks.harness.arms import (
    Arm,
    default_server,
    finish,
    make_sessions,
    open_server,
    run_arms,
    server_info,
)


def mask_supported(url: str, model: str) -> bool:
    """True when the server at ``url`` enforces allowed_tools (tool_state names only the subset)."""
    import httpx

    from benchmarks.harness.agent_tools import agent_tools
    from benchmarks.harness.variants import allowed_tools_choice

    body = {
        "model": model,
        "max_tokens": 1,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Open the docs."}],
        "tools": agent_tools(),
        "tool_choice": allowed_tools_choice("browser_"),
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    allowed = (r.json().get("tool_state") or {}).get("allowed") if r.status_code == 200 else None
    return bool(allowed) and all(n.startswith("browser_") for n in allowed)


def run(args: argparse.Namespace) -> None:
    with open_server(default_server(args), args) as url:
        supported = mask_supported(url, args.served_model or server_info(url)["model"])
    names = (["tools_mask"] if supported else []) + ["tools_remove", "tools_keep"]
    note = (
        "tools_mask: all tools sent, the phase enforced with tool_choice allowed_tools (name_prefix)"
        if supported
        else "tools_mask NOT measured: this server does not enforce tool_choice allowed_tools; "
        "tools_keep (all tools, unrestricted) stands in: its prompt is the one tools_mask sends"
    )
    sessions = make_sessions(args)
    records = run_arms([Arm(v, v, default_server(args)) for v in names], sessions, args)
    finish(
        args.name or "tools_mask_remove",
        "Tool list changed mid-session: mask vs remove",
        records,
        args,
        sessions,
        [note],
    )
