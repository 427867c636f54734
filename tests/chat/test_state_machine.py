"""The tool-availability state machine: scripted conversations and validation errors."""

from __future__ import annotations

import pytest
import yaml

from server.chat.state_machine import StateMachineError, load_state_machine, parse_state_machine
from tests.constrain.conftest import load_tools


def call(name):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": name}}],
    }


@pytest.mark.parametrize("name", ["agent", "reply_first"])
def test_shipped_machines_over_a_scripted_conversation(name):
    machine = load_state_machine(name)
    # the default (agent) answers a new user message as OpenAI "auto" does; reply_first forces text
    names = tuple(t["function"]["name"] for t in load_tools("prefixed_agent_tools.json"))
    on_user = ("reply", "none", ()) if name == "reply_first" else ("act", "auto", names)
    browser = tuple(n for n in names if n.startswith("browser_"))
    convo = [{"role": "system", "content": "you are an agent"}]
    script = [
        ({"role": "user", "content": "find the docs"}, *on_user),
        ({"role": "assistant", "content": "On it."}, "act", "auto", names),
        (call("browser_open_site"), "browsing", "auto", browser),
        ({"role": "tool", "content": "<html>"}, "browsing", "auto", browser),
        (call("shell_exec"), "shell", "auto", ("shell_exec",)),
        ({"role": "tool", "content": "ok"}, "shell", "auto", ("shell_exec",)),
        (call("file_open"), "act", "auto", names),
        ({"role": "tool", "content": "file"}, "act", "auto", names),
        ({"role": "user", "content": "stop"}, *on_user),
    ]
    for message, state, mode, allowed in script:
        convo.append(message)
        assert tuple(machine.decide(convo, names)) == (state, mode, allowed), message


def test_the_default_machine_never_forbids_what_auto_allows_on_a_user_message():
    """After browser_/shell_ calls, a NEW user message opens every tool again (as tool_choice auto)."""
    machine = load_state_machine("agent")
    names = ("browser_x", "shell_y", "file_z")
    convo = [{"role": "user", "content": "a"}, call("browser_x"), {"role": "tool", "content": "r"}]
    assert machine.decide(convo, names).state == "browsing"
    convo.append({"role": "user", "content": "now something else"})
    assert tuple(machine.decide(convo, names)) == ("act", "auto", names)


def test_calls_before_the_last_user_message_do_not_count():
    machine = load_state_machine("agent")
    convo = [{"role": "user", "content": "a"}, call("browser_x"), {"role": "tool", "content": "r"},
             {"role": "user", "content": "b"}, {"role": "assistant", "content": "sure"}]  # fmt: skip
    assert machine.decide(convo, ["browser_x", "shell_y"]).state == "act"


def test_rules_with_names_lists_and_required(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "states": {
                    "submit_now": {"mode": "required", "allow": [{"name": "submit"}]},
                    "free": {"mode": "auto"},
                },
                "rules": [
                    {
                        "if": {"last_role": ["tool"], "last_call": {"name": ["done", "finish"]}},
                        "then": "submit_now",
                    }
                ],
                "default": "free",
            }
        )
    )
    machine = load_state_machine(str(path))
    convo = [{"role": "user", "content": "x"}, call("finish"), {"role": "tool", "content": "ok"}]
    assert tuple(machine.decide(convo, ["finish", "submit"])) == ("submit_now", "required", ("submit",))
    assert machine.decide(convo[:2], ["finish", "submit"]).state == "free"
    assert load_state_machine(str(path)) is machine  # cached until the file changes


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(StateMachineError, match="unknown tool state machine 'nope'.*'agent'"):
        load_state_machine("nope")


def one_state(state=None, **top):
    return {"states": {"a": state or {"mode": "auto"}}, "default": "a", **top}


def rule(cond, then="a"):
    return one_state(rules=[{"if": cond, "then": then}])


@pytest.mark.parametrize(
    "data, needle",
    [
        ([], "top level"),
        ({"states": {}, "default": "a"}, "states"),
        (one_state({"mode": "sometimes"}), "state 'a': mode 'sometimes'"),
        (one_state({"mode": "auto", "allow": "some"}), "state 'a': allow must be"),
        (one_state({"mode": "auto", "allow": [{"prefx": "b_"}]}), "state 'a': allow entry"),
        (one_state({"mode": "none", "allow": [{"prefix": "b_"}]}), "mode none allows no"),
        ({"states": {"a": {"mode": "auto"}}, "default": "b"}, "default: 'b' is not a state"),
        (rule({}, then="z"), "rule 1: then"),
        (rule({"when": 1}), "unknown conditions"),
        (rule({"last_role": "bot"}), "last_role 'bot'"),
        (rule({"last_call": "x"}), "last_call must be"),
        (one_state(extra=1), "unknown keys"),
    ],
)
def test_bad_machines_name_the_file_the_place_and_the_fix(data, needle):
    with pytest.raises(StateMachineError) as err:
        parse_state_machine(data, "grammars/bad.yaml")
    assert str(err.value).startswith("grammars/bad.yaml: ") and needle in str(err.value)


def test_bad_yaml_syntax(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("states: [unclosed\n")
    with pytest.raises(StateMachineError, match="broken.yaml: not valid YAML"):
        load_state_machine(str(path))
