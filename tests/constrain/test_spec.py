"""ToolSpec (the declarative tool constraint crossing the engine seam) and Compiler."""

from __future__ import annotations

import json

import pytest
import torch

from server.chat.tool_choice import ToolPlan, plan_tools
from server.constrain.bitmask import MaskApplier, pack_ids
from server.constrain.compiler import Compiler
from server.constrain.spec import EXTRA_ARGS_KEY, ToolSpec

SHELL = {
    "type": "function",
    "function": {
        "name": "shell_exec",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}
OPEN = {"type": "function", "function": {"name": "browser_open", "parameters": {"type": "object"}}}
TOOLS = [SHELL, OPEN]


def _plan(hermes, choice="required") -> ToolPlan:
    return plan_tools(TOOLS, choice, [{"role": "user", "content": "x"}], False, None, hermes)


def test_spec_round_trips_through_json(hermes):
    spec = ToolSpec(TOOLS, _plan(hermes), "hermes", "xgrammar", (2, 0), request_id="r1")
    sent = json.loads(json.dumps(spec.to_extra_args()))
    back = ToolSpec.from_json(sent[EXTRA_ARGS_KEY])
    assert back == spec and back.request_id == "r1"
    assert back.eos_token_ids == (2, 0) and back.plan.prefill == spec.plan.prefill
    # stock vLLM's vllm_xargs carries no nested objects: the spec as a JSON string is accepted too
    assert ToolSpec.from_json(json.dumps(spec.to_json())) == spec


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda s: s.update(extra=1), "unknown keys ['extra']"),
        (lambda s: s.update(tools="x"), ".tools must be a list"),
        (lambda s: s.update(plan=[]), ".plan must be an object"),
        (
            lambda s: s.update(backend="nope"),
            "backend 'nope' is not known: use one of ['outlines', 'xgrammar'",
        ),
        (lambda s: s.update(eos_token_ids=[-1]), "eos_token_ids must be a list of token ids"),
        (lambda s: s.update(envelope="nope"), "unknown tool-call envelope 'nope'"),
        (lambda s: s["plan"].pop("mode"), "not a valid ToolPlan"),
        (lambda s: s.update(tools=[OPEN]), "allows tools ['shell_exec'] that are not in"),
    ],
)
def test_from_json_names_the_bad_field(hermes, edit, needle):
    spec = ToolSpec(TOOLS, _plan(hermes), eos_token_ids=(2,)).to_json()
    edit(spec)
    with pytest.raises(ValueError) as err:
        ToolSpec.from_json(spec)
    assert needle in str(err.value)


def test_builder_builds_what_the_factory_builds(tokenizer, compiler, hermes):
    """The whole (what both engines use) gives the same first mask as the compiler directly."""
    whole = Compiler(tokenizer, compiler.vocab.vocab_size, (2,))
    for choice in ("required", "auto", {"type": "function", "function": {"name": "browser_open"}}):
        plan = _plan(hermes, choice)
        mine = whole.build(ToolSpec(TOOLS, plan))  # no EOS in the spec: the whole's own
        ref = compiler.build(TOOLS, plan, (2,))
        a = torch.zeros((1, compiler.vocab.words), dtype=torch.int32)
        b = torch.zeros_like(a)
        mine.fill_next_token_bitmask(a, 0)
        ref.fill_next_token_bitmask(b, 0)
        assert torch.equal(a, b), choice
    assert whole.for_envelope("hermes", "xgrammar") is whole.for_envelope("hermes", "xgrammar")
    assert whole.build(ToolSpec([], _plan(hermes, "none"))) is None
    with pytest.raises(ValueError, match="unknown arguments backend"):
        whole.for_envelope("hermes", "nope")


def test_pack_ids_and_apply_rows_mask_only_the_given_rows():
    vocab = 70
    applier = MaskApplier(vocab)
    logits = torch.zeros((3, vocab))
    bitmask = applier.buffer(3)
    bitmask.numpy()[1] = pack_ids([0, 33, 69, 200], vocab)  # 200 is out of range: ignored
    applier.apply_rows(logits, bitmask[:3], [1])
    assert torch.isfinite(logits[0]).all() and torch.isfinite(logits[2]).all()
    assert torch.nonzero(torch.isfinite(logits[1])).flatten().tolist() == [0, 33, 69]
