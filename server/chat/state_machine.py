"""The tool-availability state machine: which tools may be called now, as data (YAML).

A machine has named *states* (a mode and the tools it allows, by name or prefix) and
ordered *rules*; the first rule whose conditions all hold for the conversation picks
the state, else ``default``. ``decide`` is a pure function of (messages, tool names):
the state is re-derived on every request, so nothing is stored between requests and
every replica of the server agrees. The format is documented in
``server/constrain/README.md``; ``grammars/agent.yaml`` is the default (Manus-style).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple, cast

import yaml

from server.constrain.plan import MODES, Mode
from server.package_data import GRAMMARS_DIR

ROLES = ("system", "developer", "user", "assistant", "tool")
CONDITIONS = ("last_role", "tool_results", "last_call")


class StateMachineError(ValueError):
    """A state machine file is missing or invalid; the message names the file, the place and the fix."""


Fail = Callable[[str, str], StateMachineError]  # (where, message) -> the error to raise


class Decision(NamedTuple):
    state: str
    mode: Mode
    allowed: tuple[str, ...]


@dataclass(frozen=True)
class State:
    name: str
    mode: Mode
    names: frozenset[str]  # exact tool names
    prefixes: tuple[str, ...]
    everything: bool  # allow: all

    def allows(self, tool: str) -> bool:
        return self.everything or tool in self.names or tool.startswith(self.prefixes)


@dataclass(frozen=True)
class Rule:
    state: str
    last_role: frozenset[str] | None
    tool_results: bool | None
    last_call_names: frozenset[str]
    last_call_prefixes: tuple[str, ...]
    has_last_call: bool

    def matches(self, turn: Turn) -> bool:
        if self.last_role is not None and turn.last_role not in self.last_role:
            return False
        if self.tool_results is not None and turn.tool_results != self.tool_results:
            return False
        last_call = turn.last_call
        if self.has_last_call:
            if last_call is None:
                return False
            if not (last_call in self.last_call_names or last_call.startswith(self.last_call_prefixes)):
                return False
        return True


@dataclass(frozen=True)
class StateMachine:
    name: str
    path: str
    states: dict[str, State]
    rules: tuple[Rule, ...]
    default: str

    def decide(self, messages: list[dict[str, Any]], tool_names: tuple[str, ...] | list[str]) -> Decision:
        turn = Turn.of(messages)
        state = self.states[next((r.state for r in self.rules if r.matches(turn)), self.default)]
        return Decision(state.name, state.mode, tuple(n for n in tool_names if state.allows(n)))


class Turn(NamedTuple):
    """What the rules look at: the conversation's end, seen as the client's latest turn.

    ``tool_results``: the messages after the assistant's last message hold a tool result. A
    client may send text beside its tool results in the same turn (Claude Code appends a
    ``<system-reminder>`` block to a ``tool_result`` message; the Messages dialect makes
    that a ``user`` message after the ``tool`` ones), so ``last_role`` alone cannot say
    whether the tools answered. ``last_call``: the assistant's most recent tool call,
    looking past user text that came in a turn with tool results; a user message in a
    turn without tool results (a new request) ends the search.
    """

    last_role: str | None
    tool_results: bool
    last_call: str | None

    @classmethod
    def of(cls, messages: list[dict[str, Any]]) -> Turn:
        results = False
        for msg in reversed(messages):
            role = msg.get("role")
            if role == "assistant":
                break
            results = results or role == "tool"
        return cls(messages[-1].get("role") if messages else None, results, last_call(messages, results))


def last_call(messages: list[dict[str, Any]], tool_results: bool) -> str | None:
    """The function name of the assistant's most recent tool call (``Turn.last_call``)."""
    in_last_turn = True
    for msg in reversed(messages):
        role = msg.get("role")
        if role == "user" and not (in_last_turn and tool_results):
            return None
        if role == "assistant":
            in_last_turn = False
            calls = msg.get("tool_calls")
            if calls:
                fn = calls[-1].get("function") or {}
                name = fn.get("name")
                return name if isinstance(name, str) else None
    return None


# --- loading and validation -------------------------------------------------------------------
def available() -> list[str]:
    return sorted(p.stem for p in GRAMMARS_DIR.glob("*.yaml"))


def load_state_machine(name_or_path: str | Path) -> StateMachine:
    """grammars/NAME.yaml, or a path to a .yaml file; validated (``StateMachineError`` if not)."""
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or "/" in text:
        path = Path(text)
        if not path.is_file():
            raise StateMachineError(f"state machine file {path} does not exist")
    else:
        path = GRAMMARS_DIR / f"{text}.yaml"
        if not path.is_file():
            raise StateMachineError(
                f"unknown tool state machine {text!r}: use one of {available()} or a path to a .yaml file"
            )
    return _load(str(path.resolve()), path.stat().st_mtime_ns)


@lru_cache(maxsize=32)
def _load(path: str, _mtime: int) -> StateMachine:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise StateMachineError(f"{path}: not valid YAML: {exc}") from exc
    return parse_state_machine(data, path)


def parse_state_machine(data: Any, path: str = "<memory>") -> StateMachine:
    def fail(where: str, msg: str) -> StateMachineError:
        return StateMachineError(f"{path}: {where}: {msg}")

    if not isinstance(data, dict):
        raise fail("top level", "expected a mapping with 'states', 'rules' and 'default'")
    extra = set(data) - {"name", "description", "states", "rules", "default"}
    if extra:
        raise fail(
            "top level", f"unknown keys {sorted(extra)}; allowed: name, description, states, rules, default"
        )
    raw_states = data.get("states")
    if not isinstance(raw_states, dict) or not raw_states:
        raise fail("states", "expected a mapping of state name → {mode, allow}")
    states = {name: _state(name, spec, fail) for name, spec in raw_states.items()}
    default = data.get("default")
    if not isinstance(default, str) or default not in states:
        raise fail("default", f"{default!r} is not a state; set default to one of {sorted(states)}")
    raw_rules = data.get("rules") or []
    if not isinstance(raw_rules, list):
        raise fail("rules", "expected a list of {if: {...}, then: STATE}")
    rules = tuple(_rule(i, spec, states, fail) for i, spec in enumerate(raw_rules))
    return StateMachine(str(data.get("name") or Path(path).stem), path, states, rules, default)


def _state(name: str, spec: Any, fail: Fail) -> State:
    where = f"state {name!r}"
    if not isinstance(spec, dict):
        raise fail(where, "expected a mapping like {mode: auto, allow: all}")
    extra = set(spec) - {"mode", "allow", "description"}
    if extra:
        raise fail(where, f"unknown keys {sorted(extra)}; allowed: mode, allow, description")
    mode = spec.get("mode")
    if mode not in MODES:
        raise fail(where, f"mode {mode!r} is not one of {list(MODES)}")
    mode = cast(Mode, mode)
    allow = spec.get("allow", "all" if mode != "none" else [])
    if allow == "all":
        return State(name, mode, frozenset(), (), True)
    if not isinstance(allow, list):
        raise fail(where, "allow must be 'all' or a list of {name: TOOL} / {prefix: PREFIX}")
    names: set[str] = set()
    prefixes: list[str] = []
    for entry in allow:
        if isinstance(entry, dict) and set(entry) == {"name"} and isinstance(entry["name"], str):
            names.add(entry["name"])
        elif isinstance(entry, dict) and set(entry) == {"prefix"} and isinstance(entry["prefix"], str):
            prefixes.append(entry["prefix"])
        else:
            raise fail(where, f"allow entry {entry!r} must be {{name: TOOL}} or {{prefix: PREFIX}}")
    if mode == "none" and (names or prefixes):
        raise fail(where, "mode none allows no tools: remove 'allow' or use mode auto")
    return State(name, mode, frozenset(names), tuple(prefixes), False)


def _rule(i: int, spec: Any, states: dict[str, State], fail: Fail) -> Rule:
    where = f"rule {i + 1}"
    if not isinstance(spec, dict) or set(spec) != {"if", "then"} or not isinstance(spec["if"], dict):
        raise fail(where, "expected {if: {last_role: ..., tool_results: ..., last_call: ...}, then: STATE}")
    if spec["then"] not in states:
        raise fail(where, f"then: {spec['then']!r} is not a state; use one of {sorted(states)}")
    cond = spec["if"]
    extra = set(cond) - set(CONDITIONS)
    if extra:
        raise fail(where, f"unknown conditions {sorted(extra)}; allowed: {list(CONDITIONS)}")
    roles = None
    if "last_role" in cond:
        raw = cond["last_role"]
        roles = frozenset([raw] if isinstance(raw, str) else raw if isinstance(raw, list) else [object()])
        bad = [r for r in roles if r not in ROLES]
        if bad:
            raise fail(where, f"last_role {raw!r}: use one or a list of {list(ROLES)}")
    results = cond.get("tool_results")
    if results is not None and not isinstance(results, bool):
        raise fail(where, f"tool_results {results!r}: use true or false")
    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    if "last_call" in cond:
        call = cond["last_call"]
        if not isinstance(call, dict) or not set(call) <= {"name", "prefix"} or not call:
            raise fail(where, "last_call must be {name: TOOL} or {prefix: PREFIX} (a string or a list each)")

        def strings(key: str) -> tuple[str, ...]:
            raw = call.get(key, [])
            vals = [raw] if isinstance(raw, str) else raw
            if not isinstance(vals, list) or not all(isinstance(v, str) and v for v in vals):
                raise fail(where, f"last_call.{key} must be a non-empty string or a list of them")
            return tuple(vals)

        names, prefixes = frozenset(strings("name")), strings("prefix")
    return Rule(spec["then"], roles, results, names, prefixes, "last_call" in cond)
