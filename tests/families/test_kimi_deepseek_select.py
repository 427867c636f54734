"""Kimi K2 and DeepSeek V3.1 are told apart from the other families, and from their own other
versions, by the vocabulary and the chat template; their test models serve (make-test-model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server.cli import main
from server.families.render import FamilyRenderer
from server.families.select import ModelFacts, detect_family, select_family
from server.protocol import ChatMessage

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
KIMI = frozenset(
    {"<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>"}
    | {"<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_end|>"}
)
DEEPSEEK = frozenset(
    {"<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"}
    | {"<｜tool▁output▁begin｜>", "<｜tool▁call▁begin｜>"}
)


@pytest.mark.parametrize(
    ("facts", "want"),
    [
        (
            ModelFacts(special_tokens=KIMI, chat_template=(TEMPLATES / "kimi-k2-thinking.jinja").read_text()),
            "kimi_k2",
        ),
        (ModelFacts(special_tokens=KIMI), "kimi_k2"),  # no template: the thinking layout
        # a K2-Instruct template (no <think>): the instruct version, no reasoning forced
        (
            ModelFacts(special_tokens=KIMI, chat_template="{{ '<|im_assistant|>assistant<|im_middle|>' }}"),
            "kimi_k2:instruct",
        ),
        (ModelFacts(special_tokens=KIMI - {"<|tool_call_begin|>"}), None),
        (
            ModelFacts(
                special_tokens=DEEPSEEK, chat_template=(TEMPLATES / "deepseek-v3.1.jinja").read_text()
            ),
            "deepseek_v31",
        ),
        # V3.2 shares the vocabulary: DSML in the template, or no template (its encoding script), is not V3.1
        (
            ModelFacts(
                special_tokens=DEEPSEEK,
                chat_template="<｜tool▁calls▁begin｜><｜tool▁output▁begin｜> ｜DSML｜",
            ),
            None,
        ),
        (ModelFacts(special_tokens=DEEPSEEK), None),
    ],
)
def test_detection(facts: ModelFacts, want: str | None) -> None:
    found = detect_family(facts)
    assert (found.family.ref if found is not None else None) == want


@pytest.mark.parametrize("ref", ["kimi_k2", "deepseek_v31"])
def test_make_test_model_serves_its_family(ref: str, tmp_path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "m"
    assert main(["make-test-model", "--family", ref, str(out)]) == 0
    tok = AutoTokenizer.from_pretrained(out)
    assert select_family("auto", out, tok).family.ref == ref  # declared in config.json
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("agentserve_family")
    (out / "config.json").write_text(json.dumps(cfg))
    found = detect_family_of(out, tok)
    # by the vocabulary alone: Kimi; DeepSeek V3.1 needs its template (V3.2 shares the vocabulary;
    # the test vocabulary is SmolLM2's + DeepSeek's tokens, so it reads as ChatML: hermes)
    assert (found == ref) == (ref == "kimi_k2"), found
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = tok(
        FamilyRenderer(ref).render([ChatMessage(role="user", content="hi")], []).text,
        add_special_tokens=False,
    )["input_ids"]
    with torch.no_grad():
        assert model(torch.tensor([ids])).logits.shape[-1] == len(tok)
    assert model.generation_config.eos_token_id


def detect_family_of(folder: Path, tok: object) -> str | None:
    from server.families.select import model_facts

    found = detect_family(model_facts(folder, tok))
    return found.family.ref if found is not None else None
