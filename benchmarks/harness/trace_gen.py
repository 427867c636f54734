"""Seeded agent-trace generator: the shape of a real agent session, sized to a model's context.

A session is a fixed system prompt, 24 tools (browser_*, shell_*, file_*), a user task,
then up to ``steps`` (default 50) steps of one assistant tool call + one tool
observation, with an occasional new user message in between. Steps come in phases
(a run of browser work, then shell, then file edits ...); the phase's prefix is what a
tool-availability state would allow at that turn (used by the mask/remove variants).

Sizes. Observations are drawn log-uniform in [100, 2000] tokens (prompt:output about
100:1: a call is ~30 tokens) and then scaled by one factor per session so that all
steps fit the context budget: ``(context - reserve) * 0.97`` minus the system prompt,
tools and task. With the embedded model's 8,192 tokens the factor is about 0.1, i.e.
observations of ~15-200 tokens; at 128k it is 1. If a step still does not fit (the
draw was unlucky) the session STOPS before it: no observation is ever cut; the
session's ``notes`` say how many steps were kept and the scale used.

Determinism: everything comes from ``random.Random(f"{seed}:{index}")`` and the
token counter; the same (seed, index, context, steps, counter) gives the same bytes.
Token counts use ``count_tokens`` (the server's tokenizer in the runner; a chars/3.6
estimate by default) plus a fixed per-message overhead for the chat template.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness.agent_tools import PREFIXES, agent_tools

CountTokens = Callable[[str], int]
PromptTokens = Callable[[list[dict[str, Any]], list[dict[str, Any]]], int]

OBS_MIN, OBS_MAX = 100, 2000  # nominal observation sizes (tokens), before scaling
MSG_OVERHEAD = 8  # template tokens around one message (<|im_start|>role ... <|im_end|>)
CALL_OVERHEAD = (
    29  # <tool_call>{"name": ..., "arguments": ...}</tool_call>, <tool_response> tags (measured: 45 per step)
)
TOOL_OVERHEAD = 4  # per tool line in the tools block
BUDGET_MARGIN = 0.97  # head-room for the estimate vs the exact tokenizer count

SYSTEM_PROMPT = (
    "You are Forge, an autonomous software agent working in a sandboxed workspace with a browser, "
    "a shell and a file system. You solve the user's task by calling tools, one call per turn, "
    "and you read every tool result before the next call.\n\n"
    "Rules:\n"
    "1. Read a file before you edit it; keep edits minimal and in the style of the surrounding code.\n"
    "2. Run the relevant tests after every change and before you report success.\n"
    "3. Use the browser only for documentation and issue trackers; never enter credentials.\n"
    "4. Shell commands run without a terminal: no interactive programs, no editors, no pagers.\n"
    "5. If a command fails, read the error, form a hypothesis and test it; do not repeat a failing call.\n"
    "6. When the task is done, reply with a short summary of what you changed and why, without a tool call.\n"
    "7. Never delete files outside the workspace and never push to a remote.\n"
)


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate (about 3.6 characters per token for English and code)."""
    return max(1, math.ceil(len(text) / 3.6))


@dataclass(frozen=True)
class Turn:
    """One request of a session: the prompt is ``messages[:end]``; the reply is ``messages[end]``."""

    index: int  # 1-based turn number
    end: int
    phase: str  # tool-name prefix allowed at this turn ("" = no restriction)


@dataclass
class Session:
    session_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    turns: list[Turn]
    source: str = "synthetic"
    notes: str = ""
    est_tokens: int = 0  # estimated tokens of the last turn's prompt
    meta: dict[str, Any] = field(default_factory=dict)


# -- text material ----------------------------------------------------------------------
_WORDS = (
    "the a request cache token session worker config parser value error test file module function return "
    "import class method argument default timeout retry buffer stream client server handler response header "
    "schema field index offset length prefix suffix block hash queue thread lock state event output input "
    "user task agent tool call result status check build release version install package path directory "
    "line column match pattern search replace update delete create open close read write load save parse "
    "format encode decode serialize validate expected actual missing invalid unknown deprecated warning"
).split()
_IDENTS = (
    "parse_config load_settings build_app handle_request read_block cache_key resolve_path run_tests".split()
)
_DIRS = ["src", "src/core", "src/api", "tests", "docs", "scripts", "lib/utils", "config"]
_EXTS = [".py", ".py", ".py", ".md", ".yaml", ".toml", ".json"]
_SITES = [
    "docs.python.org/3/library",
    "github.com/acme/widgets/issues",
    "stackoverflow.com/questions",
    "pypi.org/project",
    "developer.mozilla.org/en-US/docs",
]
_TASKS = [
    "The CLI crashes with KeyError: 'name' when the YAML config has no name field. Find the cause, "
    "fix it, and add a regression test.",
    "Our HTTP client retries POST requests that are not idempotent. Make retries opt-in for POST, "
    "document the change and make sure the existing tests still pass.",
    "Upgrade the project to the latest minor release of its YAML library, fix whatever breaks, and check the "
    "changelog for deprecations we rely on.",
    "The nightly job reports a flaky test in tests/test_scheduler.py. Reproduce the flake, find the race and "
    "fix it without sleeping in the test.",
    "Add a --json flag to the status command that prints the same information as machine-readable JSON, with "
    "tests and a line in the README.",
]
_THOUGHTS = [
    "Let me look at that first.",
    "I'll check the output before changing anything.",
    "That narrows it down; next I will inspect the code path.",
    "Running the tests to confirm.",
    "The error points at the config loader.",
    "I need the exact signature before editing.",
    "This confirms the hypothesis; now the fix.",
    "Checking the documentation for the expected behaviour.",
]
_USER_FOLLOWUPS = [
    "Also make sure it still works on Python 3.10.",
    "Please don't change the public API while you are at it.",
    "FYI the CI image was updated this morning; rerun the tests if something looks odd.",
    "Can you keep the diff small? Reviewers are busy this week.",
]


class _Text:
    def __init__(self, rng: random.Random, count: CountTokens) -> None:
        self.rng, self.count = rng, count

    def path(self) -> str:
        r = self.rng
        return f"{r.choice(_DIRS)}/{r.choice(_IDENTS)}{r.choice(_EXTS)}"

    def sentence(self, n: int) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(n)).capitalize() + "."

    def code_line(self, no: int) -> str:
        r = self.rng
        kind = r.randrange(5)
        ind = "    " * r.randrange(3)
        if kind == 0:
            body = f"def {r.choice(_IDENTS)}({r.choice(_WORDS)}, {r.choice(_WORDS)}=None):"
        elif kind == 1:
            body = f"{r.choice(_WORDS)} = {r.choice(_IDENTS)}({r.choice(_WORDS)}[{r.randrange(64)}])"
        elif kind == 2:
            body = f"if {r.choice(_WORDS)} is None:  # {r.choice(_WORDS)} {r.choice(_WORDS)}"
        elif kind == 3:
            body = f"return {r.choice(_WORDS)}.{r.choice(_IDENTS)}()"
        else:
            body = f'raise ValueError(f"{r.choice(_WORDS)} {{{r.choice(_WORDS)}!r}} is {r.choice(_WORDS)}")'
        return f"{no:5d}\t{ind}{body}"

    def line_for(self, tool: str, no: int) -> str:
        r = self.rng
        if tool.startswith("browser_"):
            if r.random() < 0.2:
                return f"[{no}] {self.sentence(3)[:-1]} (https://{r.choice(_SITES)}/{r.randrange(10**5)})"
            return self.sentence(r.randint(6, 16))
        if tool == "shell_run_tests":
            status = r.choice(["PASSED", "PASSED", "PASSED", "FAILED", "SKIPPED"])
            return f"tests/test_{r.choice(_IDENTS)}.py::test_{r.choice(_WORDS)}_{r.choice(_WORDS)} {status}"
        if tool.startswith("shell_"):
            return r.choice(
                [
                    f"-rw-r--r-- 1 agent agent {r.randrange(100, 90000):6d} "
                    f"Nov {r.randint(1, 28):2d} {self.path()}",
                    f"{self.path()}:{r.randrange(1, 900)}: "
                    f"{r.choice(_WORDS)} {r.choice(_IDENTS)} {r.choice(_WORDS)}",
                    f"{r.randrange(16**7):07x} {self.sentence(r.randint(4, 9))}",
                ]
            )
        if tool == "file_search":
            return f"{self.path()}:{r.randrange(1, 900)}:{self.code_line(no).split(chr(9), 1)[1]}"
        return self.code_line(no)

    def block(self, tool: str, target: int) -> str:
        """Lines of tool output, at most ``target`` tokens by ``count`` (at least one line)."""
        header = f"[{tool} ok]"
        lines = [header]
        used = self.count(header) + 1
        no = self.rng.randrange(1, 400)
        while True:
            line = self.line_for(tool, no)
            cost = self.count(line) + 1
            if used + cost > target and len(lines) > 1:
                break
            lines.append(line)
            used += cost
            no += 1
            if used >= target:
                break
        return "\n".join(lines)

    def arguments(self, tool: str) -> dict[str, Any]:
        r = self.rng
        p = self.path()
        table: dict[str, dict[str, Any]] = {
            "browser_navigate": {
                "url": f"https://{r.choice(_SITES)}/{r.randrange(10**5)}",
                "wait_until": "load",
            },
            "browser_click": {"selector": f"#{r.choice(_WORDS)}-{r.randrange(40)}", "button": "left"},
            "browser_type": {
                "selector": "input[name=q]",
                "text": f"{r.choice(_IDENTS)} {r.choice(_WORDS)}",
                "submit": True,
            },
            "browser_scroll": {"direction": r.choice(["up", "down"]), "pixels": 100 * r.randint(2, 9)},
            "browser_screenshot": {"full_page": r.random() < 0.5},
            "browser_back": {},
            "browser_get_text": {"selector": "main", "max_chars": 4000},
            "browser_find": {"query": r.choice(_IDENTS), "regex": False},
            "browser_wait": {"selector": f".{r.choice(_WORDS)}", "timeout_ms": 2000},
            "shell_exec": {
                "command": f"grep -rn {r.choice(_IDENTS)} {r.choice(_DIRS)} | head -50",
                "cwd": ".",
                "timeout_s": 60,
            },
            "shell_run_tests": {
                "path": "tests",
                "keyword": r.choice(_WORDS),
                "verbose": True,
                "max_failures": 5,
            },
            "shell_install": {"package": r.choice(["pyyaml", "httpx", "pytest-timeout"]), "manager": "pip"},
            "shell_git": {
                "args": r.choice([["status"], ["diff", "--stat"], ["log", "--oneline", "-n", "20"]])
            },
            "shell_env": {"name": "PYTHONPATH"},
            "shell_ps": {"filter": "python"},
            "shell_kill": {"pid": r.randrange(100, 60000), "signal": "TERM"},
            "file_read": {
                "path": p,
                "start_line": (s := r.randrange(1, 400)),
                "end_line": s + r.randrange(20, 120),
            },
            "file_write": {"path": p, "content": self.code_line(1).split("\t", 1)[1] + "\n"},
            "file_edit": {
                "path": p,
                "old": f"{r.choice(_WORDS)} = None",
                "new": f"{r.choice(_WORDS)} = {{}}",
                "replace_all": False,
            },
            "file_list": {"path": r.choice(_DIRS), "recursive": r.random() < 0.3, "pattern": "*.py"},
            "file_search": {"pattern": r.choice(_IDENTS), "path": ".", "regex": False, "max_results": 50},
            "file_delete": {"path": p},
            "file_move": {"src": p, "dst": self.path(), "overwrite": False},
            "file_stat": {"path": p},
        }
        return table[tool]


def _phases(rng: random.Random, steps: int) -> list[str]:
    out: list[str] = []
    prev = ""
    while len(out) < steps:
        prefix = rng.choice([p for p in PREFIXES if p != prev])
        out.extend([prefix] * rng.randint(6, 14))
        prev = prefix
    return out[:steps]


def tools_tokens(tools: list[dict[str, Any]], count: CountTokens) -> int:
    return (
        sum(count(json.dumps(t, sort_keys=True, separators=(", ", ": "))) + TOOL_OVERHEAD for t in tools) + 20
    )


def generate_session(
    seed: int,
    index: int = 0,
    *,
    context: int = 8192,
    steps: int = 50,
    reserve: int = 256,
    count_tokens: CountTokens = approx_tokens,
    prompt_tokens: PromptTokens | None = None,
    user_message_rate: float = 0.06,
) -> Session:
    """One synthetic session (see the module docstring for sizes and the stop rule).

    ``prompt_tokens(messages, tools)``, when given, is the exact size of a rendered prompt
    (the server's template + tokenizer): the stop rule then uses it instead of the estimate.
    """
    rng = random.Random(f"{seed}:{index}")
    text = _Text(rng, count_tokens)
    tools = agent_tools()
    names = [t["function"]["name"] for t in tools]
    task = rng.choice(_TASKS)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task},
    ]
    fixed = tools_tokens(tools, count_tokens) + sum(
        count_tokens(m["content"]) + MSG_OVERHEAD for m in messages
    )
    usable = context - reserve if prompt_tokens else int((context - reserve) * BUDGET_MARGIN)
    mean_obs = (OBS_MAX - OBS_MIN) / math.log(OBS_MAX / OBS_MIN)
    per_step_other = 85  # thought + call + template overheads, measured on this generator
    scale = min(1.0, max(0.0, usable - fixed - steps * per_step_other) / (steps * mean_obs))
    phases = _phases(rng, steps)
    est = fixed
    turns: list[Turn] = []
    stopped = ""
    for step in range(steps):
        phase = phases[step]
        tool = (
            rng.choice([n for n in names if n.startswith(phase)])
            if rng.random() < 0.85
            else rng.choice(names)
        )
        args = text.arguments(tool)
        thought = rng.choice(_THOUGHTS)
        obs_target = max(12, round(math.exp(rng.uniform(math.log(OBS_MIN), math.log(OBS_MAX))) * scale))
        obs = text.block(tool, obs_target)
        follow = (
            rng.choice(_USER_FOLLOWUPS) if 0 < step < steps - 1 and rng.random() < user_message_rate else None
        )
        arguments = json.dumps(args)
        cost = (
            count_tokens(thought)
            + count_tokens(tool)
            + count_tokens(arguments)
            + CALL_OVERHEAD
            + MSG_OVERHEAD
            + count_tokens(obs)
            + MSG_OVERHEAD
            + (count_tokens(follow) + MSG_OVERHEAD if follow else 0)
        )
        call_id = f"call_{index}_{step}"
        new = [
            {
                "role": "assistant",
                "content": thought,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": tool, "arguments": arguments}}
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": obs},
        ]
        if follow:
            new.append({"role": "user", "content": follow})
        # the largest prompt this step adds is the one of the NEXT turn: everything up to here
        size = prompt_tokens(messages + new, tools) if prompt_tokens else est + cost
        if size > usable:
            stopped = f"stopped before step {step + 1}: it would exceed the budget ({size} > {usable} tokens)"
            break
        turns.append(Turn(len(turns) + 1, len(messages), phase))
        messages.extend(new)
        est = size
    kept = len(turns)
    notes = (
        f"{kept} of {steps} steps kept; observations scaled x{scale:.3f} "
        f"({max(12, round(OBS_MIN * scale))}-{max(12, round(OBS_MAX * scale))} tokens) to fit "
        f"{context} - {reserve} tokens" + (f"; {stopped}" if stopped else "")
    )
    return Session(
        session_id=f"s{seed}-{index}",
        messages=messages,
        tools=tools,
        turns=turns,
        notes=notes,
        est_tokens=est,
        meta={
            "seed": seed,
            "index": index,
            "context": context,
            "steps": steps,
            "scale": scale,
            "kept_steps": kept,
            "stopped": bool(stopped),
        },
    )


def generate_sessions(seed: int, n: int, **kw: Any) -> list[Session]:
    return [generate_session(seed, i, **kw) for i in range(n)]
