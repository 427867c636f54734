"""The tool-availability state machine: scripted conversations and validation errors."""

from __future__ import annotations

import pytest
import yaml

from server.chat.state_machine import StateMachineError, load_state_machine, parse_state_machine
from server.dialects.messages.blocks import chat_messages
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
        # user text in the turn that brought tool results (Claude Code's reminders): not a new request
        ({"role": "user", "content": "note"}, "act", "auto", names),
        ({"role": "assistant", "content": "Done."}, "act", "auto", names),
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


def claude_code_turn(text_after_results: bool) -> list[dict]:
    """A Messages request as Claude Code sends it after a Read, converted by the Messages dialect:
    the tool_result, and (sometimes) a <system-reminder> text block beside it in the same turn."""
    result = [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1\tprint('hi')"}]
    if text_after_results:
        result.append({"type": "text", "text": "<system-reminder>The file is short.</system-reminder>"})
    return chat_messages(
        "You are Claude Code.",
        [
            {"role": "user", "content": [{"type": "text", "text": "what is in a.py?"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "browser_read",
                                               "input": {"file_path": "a.py"}}]},
            {"role": "user", "content": result},
        ],
    )  # fmt: skip


@pytest.mark.parametrize("text_after_results", [False, True])
def test_tool_results_with_client_text_beside_them_are_still_tool_results(text_after_results):
    """Claude Code's reminder after a tool_result made the last role 'user': read_then_answer asked for
    another Read (a chance CI failure) and reply_first forbade tools mid-loop. ``tool_results`` and
    ``last_call`` look at the whole turn."""
    convo = claude_code_turn(text_after_results)
    assert convo[-1]["role"] == ("user" if text_after_results else "tool")
    names = ("browser_read", "shell_exec", "Read")
    assert load_state_machine("read_then_answer").decide(convo, names).state == "answer"
    assert tuple(load_state_machine("reply_first").decide(convo, names)) == (
        "browsing",
        "auto",
        ("browser_read",),
    )
    # the default's first rule is literal (any last user message opens every tool): never narrower than auto
    assert load_state_machine("agent").decide(convo, names).state == (
        "act" if text_after_results else "browsing"
    )
    # a new request (a user turn without tool results) is still a new request
    convo += [{"role": "assistant", "content": "It prints hi."}, {"role": "user", "content": "thanks"}]
    assert load_state_machine("read_then_answer").decide(convo, names).state == "look"
    assert load_state_machine("reply_first").decide(convo, names).state == "reply"


def test_tool_results_condition_is_checked():
    machine = parse_state_machine(
        {"states": {"a": {"mode": "auto"}, "b": {"mode": "none"}}, "default": "a",
         "rules": [{"if": {"tool_results": False, "last_role": "user"}, "then": "b"}]}
    )  # fmt: skip
    assert machine.decide([{"role": "user", "content": "x"}], []).state == "b"
    assert (
        machine.decide([{"role": "tool", "content": "x"}, {"role": "user", "content": "y"}], []).state == "a"
    )


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
        (rule({"tool_results": "yes"}), "tool_results 'yes': use true or false"),
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
