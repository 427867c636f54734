"""Masks of the sectioned envelopes (Kimi K2, DeepSeek V3.1: every marker a special token) on each
family's test vocabulary (SmolLM2's + the family's special tokens), read back by our parser.

Random walks (seeded) through every tool_choice form: ``auto`` (text, then a section or not),
``required`` / a named tool / an allowed subset (the opening forced after the reasoning), ``none``
(no section token can be written), ``parallel_tool_calls`` false (one call, then the section's
close); guided walks write chosen calls (quotes, newlines, unicode, several in one section) and
must be let through token for token; a ``max_tokens`` budget never begins a call that cannot
finish, and a reply cut inside a call is left unfinished, never a call.
"""

from __future__ import annotations

import json

import pytest

from server.chat.reasoning_reply import ReasoningSplitter
from server.chat.toolcalls import StreamingToolCallParser, parse_tool_calls
from server.families.family import load_family
from tests.families.section_walk import QUOTED, TOOLS, guided_walk, plan, random_walk, setup

REFS = ["kimi_k2", "deepseek_v31"]
ALL = ("shell_exec", "shell_ls", "shell_exit")
SMALL = ("shell_ls", "shell_exit")  # arguments a random walk finishes (free strings: guided walks)


def _split(ref: str, text: str) -> tuple[str | None, str]:
    r = load_family(ref).reasoning
    if r is None:
        return None, text
    s = ReasoningSplitter(plan(ref, "auto", ()).reasoning)  # type: ignore[arg-type]
    t1, a1 = s.feed(text)
    t2, a2 = s.finish()
    return t1 + t2, a1 + a2


def _calls(ref: str, text: str) -> tuple[str | None, list[tuple[str, dict, str | None]], str | None]:
    _, env, _ = setup(ref)
    thought, answer = _split(ref, text)
    out = parse_tool_calls(answer, env, TOOLS)
    return thought, [(c.name, json.loads(c.arguments), c.id) for c in out.tool_calls], out.content


@pytest.mark.slow  # random walks of up to 300 masked steps: ~8 s each
@pytest.mark.parametrize("ref", REFS)
@pytest.mark.parametrize("seed", range(4))
def test_every_tool_choice_form(ref: str, seed: int) -> None:
    _, env, _ = setup(ref)
    for mode, allowed, parallel, prefix in (
        ("required", SMALL, True, "shell_"),
        ("required", SMALL, False, "shell_"),
        ("named", ("shell_ls",), True, "shell_ls"),
        ("auto", SMALL, True, ""),
        ("auto", SMALL, False, ""),
    ):
        p = plan(ref, mode, allowed, parallel, prefix, budget=3, first=5 + seed)
        text = random_walk(ref, p, seed)
        _, calls, content = _calls(ref, text)
        where = f"{mode} {allowed} parallel={parallel}: {text!r}"
        if mode != "auto":
            assert calls, where
        assert all(name in allowed for name, _, _ in calls), where
        assert len(calls) <= (99 if parallel else 1), where
        if calls:
            assert text.endswith(env.calls_close), where  # the section is closed, nothing after it
            assert env.calls_open not in (content or ""), where
        for k, (name, args, cid) in enumerate(calls):
            if name == "shell_ls":
                assert args["path"] in ("/", "/tmp"), where
            if env.id_format:  # Kimi: functions.NAME:IDX, IDX the conversation's running index
                assert cid == f"functions.{name}:{5 + seed + k}", where
    none = random_walk(ref, plan(ref, "none", ()), seed)
    assert env.calls_open not in none and not _calls(ref, none)[1]


def _target(ref: str, calls: list[tuple[str, dict]]) -> str:
    _, env, _ = setup(ref)
    r = load_family(ref).reasoning
    think = r.open + "Let me check.\nTwo calls." + r.close if r is not None else ""
    rendered = [
        (n, json.dumps(a, ensure_ascii=False), f"functions.{n}:{i + 3}") for i, (n, a) in enumerate(calls)
    ]
    return think + "Sure — " + env.render_calls(rendered)


@pytest.mark.parametrize("ref", REFS)
def test_quotes_newlines_unicode_and_parallel_calls_pass_as_written(ref: str) -> None:
    calls = [("shell_exec", QUOTED), ("shell_ls", {"path": "/tmp"}), ("shell_exit", {})]
    target = _target(ref, calls)
    text = guided_walk(ref, plan(ref, "auto", ALL, first=3), target)
    assert text == target
    thought, got, content = _calls(ref, text)
    assert [(n, a) for n, a, _ in got] == calls and content == "Sure —"
    if load_family(ref).reasoning is not None:
        assert thought == "Let me check.\nTwo calls."
        assert [cid for _, _, cid in got] == [
            "functions.shell_exec:3",
            "functions.shell_ls:4",
            "functions.shell_exit:5",
        ]


@pytest.mark.parametrize("ref", REFS)
def test_one_call_without_parallel_calls(ref: str) -> None:
    _, env, _ = setup(ref)
    target = _target(ref, [("shell_ls", {"path": "/"}), ("shell_exit", {})])
    with pytest.raises(AssertionError, match="the masks refuse"):  # the second call cannot begin
        guided_walk(ref, plan(ref, "auto", ALL, parallel=False, first=3), target)
    one = _target(ref, [("shell_ls", {"path": "/"})])
    assert guided_walk(ref, plan(ref, "auto", ALL, parallel=False, first=3), one) == one


@pytest.mark.parametrize("ref", REFS)
def test_a_call_cut_by_max_tokens_is_unfinished_not_a_call(ref: str) -> None:
    _, env, _ = setup(ref)
    target = _target(ref, [("shell_exec", QUOTED), ("shell_ls", {"path": "/tmp"})])
    full = guided_walk(ref, plan(ref, "auto", ALL, first=3), target)
    cut = guided_walk(
        ref, plan(ref, "auto", ALL, first=3), target, max_tokens=len(setup(ref)[0](full)["input_ids"]) - 6
    )
    assert target.startswith(cut) and cut != target
    _, answer = _split(ref, cut)
    p = StreamingToolCallParser(env, TOOLS)
    p.feed(answer)
    p.finish(unfinished_as_content=False)
    names = [c.name for c in p.result().tool_calls]
    assert names == ["shell_exec"] and p.unfinished is not None and "shell_ls" in p.unfinished


@pytest.mark.parametrize("ref", REFS)
def test_no_call_begins_that_the_budget_cannot_finish(ref: str) -> None:
    """With max_tokens the masks close the section instead of beginning a call that cannot end
    with the section's close (a call as the tokenizer writes it: min_call.py)."""
    tok = setup(ref)[0]
    one = _target(ref, [("shell_exit", {})])
    two = _target(ref, [("shell_exit", {}), ("shell_exit", {})])
    n1, n2 = (len(tok(t, add_special_tokens=False)["input_ids"]) for t in (one, two))
    p = plan(ref, "auto", ALL, first=3)
    assert guided_walk(ref, p, two, budget=n2 + 1) == two  # room for both, the close and the end token
    with pytest.raises(AssertionError, match="the masks refuse"):  # the second call would not fit
        guided_walk(ref, p, two, budget=n2 - 1)
    assert guided_walk(ref, p, one, budget=n2 - 1) == one and n1 < n2 - 1


def test_kimi_call_index_goes_on_from_the_conversation() -> None:
    """Kimi's ids count every call of the conversation: the masks force the next index, not any."""
    from server.chat.tool_choice import plan_tools
    from server.constrain.plan import ToolPlan
    from server.families.envelope import load_envelope

    ref = "kimi_k2"
    target = _target(ref, [("shell_ls", {"path": "/"}), ("shell_exit", {})])  # indices 3 and 4
    assert guided_walk(ref, plan(ref, "auto", ALL, first=3), target) == target
    for first in (0, 4):
        with pytest.raises(AssertionError, match="the masks refuse"):
            guided_walk(ref, plan(ref, "auto", ALL, first=first), target)
    calls = [
        {
            "id": f"functions.shell_ls:{i}",
            "type": "function",
            "function": {"name": "shell_ls", "arguments": "{}"},
        }
        for i in range(3)
    ]
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": calls[:2]},
    ]
    msgs += [
        {"role": "assistant", "content": "", "tool_calls": calls[2:]},
        {"role": "user", "content": "more"},
    ]
    assert plan_tools(TOOLS, "auto", msgs, True, None, load_envelope("kimi_k2")).first_call_index == 3
    assert plan_tools(TOOLS, "auto", msgs, True, None, load_envelope("deepseek_v31")).first_call_index == 0
    kimi = plan_tools(TOOLS, "auto", msgs, True, None, load_envelope("kimi_k2"))
    assert ToolPlan.from_dict(kimi.to_dict()).first_call_index == 3  # it crosses the engine seam (vLLM)
