"""Property tests: random logits under every mode and random allowed subsets.

Whatever the logits, the decoded text is a Hermes call to an allowed tool with schema-valid
arguments, or text where the mode allows it; mode none never writes ``<tool_call>``; every
allowed tool is reachable. Random logits write long strings, so the logits get a bias toward
closing tokens that grows with the step, and decoding stops after a step budget: only
finished call blocks are validated, and a separate test checks that most runs finish.
"""

from __future__ import annotations

import re

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.chat.tool_choice import plan_tools
from server.constrain.arguments.seam import tool_schema
from server.constrain.tool_matcher import Phase

from .conftest import load_tools
from .decode import EOS, greedy, parse_calls, strip_eos

TOOLS = load_tools("prefixed_agent_tools.json") + [
    t for t in load_tools("swe_agent_tools.json") if t["function"]["name"] in ("open", "open_site", "goto")
]
NAMES = tuple(t["function"]["name"] for t in TOOLS)
SCHEMAS = {t["function"]["name"]: tool_schema(t) for t in TOOLS}
STEPS = 64
FORMS = ("none", "auto", "required", "named", "subset_required", "subset_auto")


class Biased:
    """Random logits plus a bias toward closing tokens, growing with the step."""

    def __init__(self, tokenizer, seed: int, eager: bool) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.v = len(tokenizer)
        ids = tokenizer.convert_tokens_to_ids
        self.strong = torch.tensor([ids(t) for t in ['"', '"}', "}}", "}", '",', ","]] + list(EOS))
        weak = ["Ċ", "</", "tool", "_", "call", ">", *"0123456789", "true", "Ġ"]
        self.weak = torch.tensor([ids(t) for t in weak])
        self.eager = eager  # push the text phase toward writing <tool_call>
        self.tag = {0: ids("<"), 1: ids("tool"), 5: ids("_"), 6: ids("call"), 10: ids(">")}

    def __call__(self, step: int, constraint) -> torch.Tensor:
        logits = torch.randn(self.v, generator=self.gen)
        logits[self.strong] += 0.5 * step
        logits[self.weak] += 0.3 * step
        if self.eager and constraint.phase == Phase.TEXT and constraint.q in self.tag:
            logits[self.tag[constraint.q]] += 50.0
        return logits


def choice_for(form: str, subset: list[str]):
    if form in ("none", "auto", "required"):
        return form
    if form == "named":
        return {"type": "function", "function": {"name": subset[0]}}
    mode = form.split("_")[1]
    entries = [{"type": "function", "function": {"name": n}} for n in subset]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": entries}}


def run_case(compiler, tokenizer, hermes, form, subset, parallel, seed, eager):
    plan = plan_tools(TOOLS, choice_for(form, subset), [], parallel, None, hermes)
    constraint = compiler.build(TOOLS, plan, EOS)
    ids, finished = greedy(constraint, len(tokenizer), STEPS, Biased(tokenizer, seed, eager))
    return plan, constraint, plan.prefill + strip_eos(tokenizer, ids), finished


def check(plan, constraint, text: str, finished: bool) -> None:
    assert constraint.error is None
    if plan.mode == "none":
        assert "<tool_call>" not in text
        return
    calls = parse_calls(text)
    for call in calls:
        assert set(call) == {"name", "arguments"}
        assert call["name"] in plan.allowed
        jsonschema.validate(call["arguments"], SCHEMAS[call["name"]])
    assert [c["name"] for c in calls] == constraint.calls
    if plan.mode == "required":
        assert text.startswith("<tool_call>\n")
    if finished and constraint.calls:
        head = text.split("<tool_call>")[0]
        body = text[len(head) :]
        assert re.fullmatch(
            r"(<tool_call>\n.*?\n</tool_call>)(\n<tool_call>\n.*?\n</tool_call>)*", body, re.S
        )
        assert plan.parallel or len(calls) == 1
    if plan.mode == "required" and finished:
        assert calls


@settings(max_examples=160, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    form=st.sampled_from(FORMS),
    subset=st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True),
    parallel=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    eager=st.booleans(),
)
def test_random_logits_always_give_valid_output(
    compiler, tokenizer, hermes, form, subset, parallel, seed, eager
):
    plan, constraint, text, finished = run_case(
        compiler, tokenizer, hermes, form, subset, parallel, seed, eager
    )
    check(plan, constraint, text, finished)


def test_most_runs_finish_within_the_budget(compiler, tokenizer, hermes):
    done = 0
    for seed in range(24):
        form = FORMS[2 + seed % 4]  # the forms that must or may call a tool
        plan, constraint, text, finished = run_case(
            compiler, tokenizer, hermes, form, [NAMES[seed % len(NAMES)]], False, seed, True
        )
        check(plan, constraint, text, finished)
        done += finished and bool(constraint.calls)
    assert done >= 18, f"only {done}/24 runs wrote a complete call"


def test_mode_none_resists_a_model_that_wants_to_call(compiler, tokenizer, hermes):
    for seed in range(6):
        plan, constraint, text, _ = run_case(
            compiler, tokenizer, hermes, "none", [NAMES[0]], False, seed, True
        )
        assert "<tool_call" in text and "<tool_call>" not in text  # it tried; the '>' was masked


def name_bias(tokenizer, hermes, plan, name: str):
    """Logits that follow the natural tokenization of the call to ``name``, after the prefill."""
    full = tokenizer.encode(hermes.call_start + hermes.name_open + name + hermes.name_close)
    want = full[len(tokenizer.encode(plan.prefill)) :]
    gen = torch.Generator().manual_seed(len(name))

    def logits(step: int, constraint) -> torch.Tensor:
        out = torch.randn(len(tokenizer), generator=gen)
        if step < len(want):
            out[want[step]] += 50.0
        return out

    return logits


@pytest.mark.parametrize("tools_file", ["swe_agent_tools.json", "prefixed_agent_tools.json"])
def test_every_tool_is_reachable(compiler, tokenizer, hermes, tools_file):
    tools = load_tools(tools_file)
    plan = plan_tools(tools, "required", [], False, None, hermes)
    for tool in tools:
        name = tool["function"]["name"]
        constraint = compiler.build(tools, plan, EOS)
        greedy(constraint, len(tokenizer), 12, name_bias(tokenizer, hermes, plan, name))
        assert constraint.phase == Phase.ARGS and constraint.trie.names[constraint.tool] == name


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(subset=st.lists(st.sampled_from(NAMES), min_size=1, max_size=8, unique=True), data=st.data())
def test_every_tool_of_a_subset_is_reachable(compiler, tokenizer, hermes, subset, data):
    form = data.draw(st.sampled_from(["subset_required", "subset_auto"]))
    plan = plan_tools(TOOLS, choice_for(form, subset), [], False, None, hermes)
    name = data.draw(st.sampled_from(subset))
    constraint = compiler.build(TOOLS, plan, EOS)
    if form == "subset_auto":  # the call starts from text: write the tag first
        assert all(constraint.accept_token(t) for t in tokenizer.encode("<tool_call>\n"))
        plan = type(plan)(plan.mode, plan.allowed, plan.parallel, "<tool_call>\n")
    greedy(constraint, len(tokenizer), 14, name_bias(tokenizer, hermes, plan, name))
    # a tool with no required arguments may finish its call within the step budget (AFTER)
    assert constraint.phase in (Phase.ARGS, Phase.AFTER), constraint.error
    assert constraint.trie.names[constraint.tool] == name
