"""agentserve make-test-model: a tiny random-weight model with the family's real tokenizer."""

from __future__ import annotations

import json

import pytest

from server.cli import main
from server.families.render import FamilyRenderer
from server.families.select import model_facts, select_family
from server.protocol import ChatMessage


@pytest.mark.parametrize(
    "ref",
    [
        "llama3_json",
        pytest.param("mistral:v13", marks=pytest.mark.slow),
        pytest.param("qwen3_coder", marks=pytest.mark.slow),
    ],
)
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
    # and detected from the vocabulary alone; Qwen3-Coder shares Qwen2.5's vocabulary (only a
    # chat template tells them apart, and test models carry none): by vocabulary it reads as hermes
    by_vocab = "hermes" if ref == "qwen3_coder" else ref
    assert select_family("auto", out, tok).family.ref == by_vocab
    facts = model_facts(out, tok)
    assert len(facts.special_tokens) > 100_000  # the real vocabulary, not a toy one
    model = AutoModelForCausalLM.from_pretrained(out)
    msgs = [ChatMessage(role="user", content="hi")]
    ids = tok(FamilyRenderer(ref).render(msgs, []).text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape[-1] == len(tok)
    assert model.generation_config.eos_token_id  # the family's end-of-turn tokens


def test_unknown_family_is_a_clear_cli_error(tmp_path, capsys) -> None:
    assert main(["make-test-model", "--family", "gpt5", str(tmp_path / "x")]) == 2
    assert "llama3_json" in capsys.readouterr().err


def test_make_test_model_glm_declares_its_family_and_keeps_the_tags_whole(tmp_path) -> None:
    """GLM's test model: SmolLM2's vocabulary + GLM's turn tokens (special) and tags (one token each,
    text), its family declared in config.json (a vocabulary without GLM's chat template is not GLM's)."""
    from transformers import AutoTokenizer

    out = tmp_path / "glm"
    assert main(["make-test-model", "--family", "glm47", str(out)]) == 0
    tok = AutoTokenizer.from_pretrained(out)
    assert select_family("auto", out, tok).family.ref == "glm47"
    prompt = FamilyRenderer("glm47").render([ChatMessage(role="user", content="hi")], []).text
    ids = tok(prompt + "<think>r</think><tool_call>x<arg_key>k</arg_key>", add_special_tokens=False)[
        "input_ids"
    ]
    text = tok.convert_ids_to_tokens(ids)
    for tag in ("[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<think>", "<tool_call>", "<arg_key>"):
        assert tag in text, (tag, text)
    assert tok.decode(ids, skip_special_tokens=True).startswith("hi<think>")  # the tags are text
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == [
        tok.convert_tokens_to_ids("<|user|>"),
        tok.convert_tokens_to_ids("<|observation|>"),
    ]
