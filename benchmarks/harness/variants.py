"""Request layouts of one session: good practice, and the ways agent code breaks the prefix cache.

``build_requests(session, variant)`` gives one request body fragment per turn
(``messages``, ``tools`` and maybe ``tool_choice``); the runner adds model, stream and
the session key. All transforms are deterministic (seeded by session id and turn).

- ``good``: append-only context, tools fixed, canonical JSON (what agentserve wants).
- ``timestamp``: "Current time: ..." at the top of the system prompt, new every turn
  (a simulated clock: a per-session start time, 7 s per turn) -> the prefix breaks within the
  first block on every turn.
- ``shuffled_keys``: every earlier tool call's ``arguments`` JSON re-serialized with its
  keys in a random order each turn. agentserve renders the client's JSON in the client's
  key order (as the models' own chat templates do), so this breaks the cache at the first
  reshuffled call, as on other servers; the cache report names it (``key_order``).
- ``edited_observation``: every 10th turn the agent "compacts" the observation of 6
  steps back (first line + "[... N characters elided by the agent ...]"); edits persist,
  so each breaks the prefix once, from that observation on.
- ``tools_remove``: only the tools of the current phase's prefix (browser_/shell_/file_)
  are sent -> the tools block (near the top) changes at every phase switch.
- ``tools_mask``: all tools are sent every turn and the phase is enforced with
  ``tool_choice: {"type": "allowed_tools", ...}`` and a ``name_prefix`` entry (needs the
  masking branch's allowed_tools support; the prompt is identical to ``good``).
- ``tools_keep``: all tools, no restriction (= ``good``; the baseline for remove while
  allowed_tools is not available).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import random
from dataclasses import dataclass
from typing import Any

from benchmarks.harness.trace_gen import Session

VARIANTS = (
    "good",
    "timestamp",
    "shuffled_keys",
    "edited_observation",
    "tools_remove",
    "tools_mask",
    "tools_keep",
)
CLOCK_START = dt.datetime(2026, 11, 22, 9, 0, 0, tzinfo=dt.UTC)
EDIT_EVERY, EDIT_LAG = 10, 6


@dataclass(frozen=True)
class RequestSpec:
    turn: int
    body: dict[str, Any]  # messages, tools, maybe tool_choice


def _shuffle_arguments(messages: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = copy.deepcopy(m)
            for c in m["tool_calls"]:
                try:
                    args = json.loads(c["function"]["arguments"])
                except json.JSONDecodeError:
                    continue
                if isinstance(args, dict):
                    keys = list(args)
                    rng.shuffle(keys)
                    c["function"]["arguments"] = json.dumps({k: args[k] for k in keys})
        out.append(m)
    return out


def _elide(text: str) -> str:
    """What a compacting agent does to an old observation: keep the first line, drop the rest."""
    first, _, rest = text.partition("\n")
    return f"{first}\n[... {len(rest)} characters elided by the agent ...]"


def allowed_tools_choice(prefix: str) -> dict[str, Any]:
    return {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "auto",
            "tools": [{"type": "function", "function": {"name_prefix": prefix}}],
        },
    }


def build_requests(session: Session, variant: str) -> list[RequestSpec]:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: choose from {', '.join(VARIANTS)}")
    msgs = session.messages
    tool_msgs = [i for i, m in enumerate(msgs) if m["role"] == "tool"]
    edited: dict[int, str] = {}
    out = []
    for turn in session.turns:
        messages = [dict(m) for m in msgs[: turn.end]]
        tools = session.tools
        body: dict[str, Any] = {}
        if variant == "timestamp":
            start = random.Random(session.session_id).randrange(86400)  # sessions start at different times
            now = CLOCK_START + dt.timedelta(seconds=start + 7 * turn.index)
            messages[0] = {
                **messages[0],
                "content": f"Current time: {now.isoformat()}\n\n{messages[0]['content']}",
            }
        elif variant == "shuffled_keys":
            messages = _shuffle_arguments(messages, random.Random(f"{session.session_id}:{turn.index}"))
        elif variant == "edited_observation":
            seen = [i for i in tool_msgs if i < turn.end]
            if turn.index % EDIT_EVERY == 0 and len(seen) > EDIT_LAG:
                edited.setdefault(seen[-EDIT_LAG - 1], _elide(msgs[seen[-EDIT_LAG - 1]]["content"]))
            for i, text in edited.items():
                messages[i] = {**messages[i], "content": text}
        elif variant == "tools_remove" and turn.phase:
            tools = [t for t in tools if t["function"]["name"].startswith(turn.phase)]
        elif variant == "tools_mask" and turn.phase:
            body["tool_choice"] = allowed_tools_choice(turn.phase)
        body["messages"] = messages
        body["tools"] = tools
        out.append(RequestSpec(turn.index, body))
    return out
