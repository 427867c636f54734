"""plan_tools: every tool_choice form, the state machine fallback, prefills, and the 400s."""

from __future__ import annotations

import pytest

from server.chat.state_machine import load_state_machine
from server.chat.tool_choice import ToolPlan, clean_name_prefix, plan_tools
from server.errors import InvalidRequest

USER = [{"role": "user", "content": "hi"}]


def tools_named(*names):
    return [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]


TOOLS = tools_named("shell_exec", "browser_open", "browser_click", "browser_close", "submit")


def allowed_tools(mode, *entries):
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": list(entries)}}


def fn(**kw):
    return {"type": "function", "function": kw}


def run(choice, tools=TOOLS, messages=USER, parallel=True, machine=None, hermes=None):
    return plan_tools(tools, choice, messages, parallel, machine, hermes)


def test_string_forms(hermes):
    assert run("auto", hermes=hermes) == ToolPlan(
        "auto", tuple(t["function"]["name"] for t in TOOLS), True, ""
    )
    assert run("none", hermes=hermes) == ToolPlan("none", (), True, "")
    req = run("required", hermes=hermes, parallel=False)
    assert (req.mode, req.prefill, req.parallel) == ("required", '<tool_call>\n{"name": "', False)


def test_named_function(hermes):
    p = run(fn(name="browser_click"), hermes=hermes)
    assert (p.mode, p.allowed, p.prefill) == (
        "required",
        ("browser_click",),
        '<tool_call>\n{"name": "browser_click',
    )


def test_allowed_tools_by_name_and_prefix(hermes):
    p = run(allowed_tools("required", fn(name_prefix="browser_")), hermes=hermes)
    assert p.allowed == ("browser_open", "browser_click", "browser_close")
    assert p.prefill == '<tool_call>\n{"name": "browser'  # not "browser_" nor "browser_cl"
    p = run(allowed_tools("auto", fn(name="submit"), fn(name="shell_exec")), hermes=hermes)
    assert (p.mode, p.allowed, p.prefill) == ("auto", ("shell_exec", "submit"), "")  # order of tools
    p = run(allowed_tools("required", {"type": "function", "name": "submit"}), hermes=hermes)
    assert p.allowed == ("submit",)  # the Responses-API entry shape is accepted too


@pytest.mark.parametrize(
    "choice, needle",
    [
        (fn(name="nope"), "'nope'"),
        (allowed_tools("auto", fn(name_prefix="file_")), "'file_'"),
        (allowed_tools("required", fn(name="browser_open"), fn(name="ghost")), "'ghost'"),
    ],
)
def test_unknown_names_are_400s_listing_the_tools(hermes, choice, needle):
    with pytest.raises(InvalidRequest) as err:
        run(choice, hermes=hermes)
    assert needle in err.value.message and "browser_open" in err.value.message
    assert (err.value.status, err.value.param) == (400, "tool_choice")


@pytest.mark.parametrize(
    "choice",
    [
        "sometimes",
        {"type": "function"},
        {"type": "function", "function": {"name": 3}},
        {"type": "allowed_tools", "allowed_tools": {"mode": "maybe", "tools": []}},
        {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "function"}]}},
        {"type": "allowed_tools"},
        ["auto"],
    ],
)
def test_malformed_tool_choice_says_the_forms(hermes, choice):
    with pytest.raises(InvalidRequest, match="allowed_tools") as err:
        run(choice, hermes=hermes)
    assert err.value.status == 400


def test_no_tools(hermes):
    assert run(None, tools=[], hermes=hermes).mode == "none"
    assert run("auto", tools=None, hermes=hermes).mode == "none"
    for choice in ("required", fn(name="x"), allowed_tools("auto", fn(name="x"))):
        with pytest.raises(InvalidRequest, match="tools"):
            run(choice, tools=[], hermes=hermes)


def test_bad_tool_lists_are_400s(hermes):
    with pytest.raises(InvalidRequest, match="twice"):
        run("auto", tools=tools_named("a", "a"), hermes=hermes)
    with pytest.raises(InvalidRequest, match="quote"):
        run("auto", tools=tools_named('a"b'), hermes=hermes)
    with pytest.raises(InvalidRequest, match="no function name"):
        run("auto", tools=[{"type": "function", "function": {}}], hermes=hermes)


def test_state_machine_decides_only_without_tool_choice(hermes):
    machine = load_state_machine("agent")
    after_browser = [
        *USER,
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "browser_open"}}]},
        {"role": "tool", "content": "page"},
    ]
    p = run(None, messages=after_browser, machine=machine, hermes=hermes)
    assert (p.state, p.mode, p.allowed) == (
        "browsing",
        "auto",
        ("browser_open", "browser_click", "browser_close"),
    )
    p = run(None, messages=USER, machine=machine, hermes=hermes)  # the default: OpenAI "auto"
    assert (p.state, p.mode, len(p.allowed), p.prefill) == ("act", "auto", 5, "")
    p = run(None, messages=USER, machine=load_state_machine("reply_first"), hermes=hermes)  # opt-in
    assert (p.state, p.mode, p.allowed, p.prefill) == ("reply", "none", (), "")
    p = run("required", messages=after_browser, machine=machine, hermes=hermes)
    assert (p.state, p.mode, len(p.allowed)) == (None, "required", 5)  # explicit wins
    assert run(None, machine=None, hermes=hermes).mode == "auto"


def test_clean_name_prefix():
    close = '", "arguments": '
    assert clean_name_prefix(["browser_click", "browser_close"], close) == "browser"
    assert clean_name_prefix(["browser_open"], close) == "browser_open"
    assert clean_name_prefix(["foo_"], close) == "foo"
    assert clean_name_prefix(["tool9", "tool99"], close) == "tool"
    assert clean_name_prefix(["file_read_v2", "file_read_v2.1"], close) == "file_read_v2"
    assert clean_name_prefix(["open", "open_site"], close) == "open"
    assert clean_name_prefix(["a", "b"], close) == ""
    assert clean_name_prefix([], close) == ""


@pytest.mark.parametrize(
    "names",
    [("browser_click", "browser_close"), ("browser_open",), ("tool9", "tool99"), ("open", "open_site"),
     ("file_read_v2", "file_read_v2.1"), ("getUser", "getUserById"), ("x.y.z",), ("get-user",)],
)  # fmt: skip
def test_prefill_tokenizes_like_the_full_call(tokenizer, hermes, names):
    """Token healing: the prefill, tokenized alone, is a token prefix of every allowed call."""
    p = run("required", tools=tools_named(*names), hermes=hermes)
    pre = tokenizer.encode(p.prefill)
    for n in names:
        full = tokenizer.encode(f'<tool_call>\n{{"name": "{n}", "arguments": {{}}}}\n</tool_call>')
        assert full[: len(pre)] == pre, (p.prefill, n)
