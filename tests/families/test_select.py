"""Which family a model gets: detection from the model folder, the config override, the errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.families.envelope import load_envelope
from server.families.family import FamilyError, family_choices, load_family
from server.families.select import ModelFacts, detect_family, select_family

LLAMA = frozenset(
    {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"}
)
CHATML = frozenset({"<|im_start|>", "<|im_end|>", "<tool_call>"})
MISTRAL = frozenset({"[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]"})
SPM_V7 = MISTRAL | {"<0x0A>", "[SYSTEM_PROMPT]"}  # Mistral Large 2411's SentencePiece vocabulary
HARMONY = frozenset(
    {"<|start|>", "<|end|>", "<|channel|>", "<|message|>", "<|call|>", "<|return|>", "<|constrain|>"}
)
GLM = frozenset({"[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>"})


def _template(name: str) -> str:
    return (Path(__file__).parent.parent / "fixtures" / "templates" / f"{name}.jinja").read_text()


@pytest.mark.parametrize(
    ("facts", "want"),
    [
        (ModelFacts(special_tokens=LLAMA, model_type="llama"), "llama3_json"),
        (ModelFacts(special_tokens=CHATML, chat_template="{{ '<tool_call>' }}"), "hermes"),
        (ModelFacts(special_tokens=CHATML, chat_template="<function=x>\n<parameter=k>"), "qwen3_coder"),
        (ModelFacts(special_tokens=CHATML, chat_template=_template("qwen2.5-instruct")), "hermes:qwen2.5"),
        # Qwen3's template thinks unless enable_thinking is false: the reasoning version
        (ModelFacts(special_tokens=CHATML, chat_template=_template("qwen3")), "hermes:qwen3_thinking"),
        (ModelFacts(special_tokens=CHATML, chat_template="<tool_call></think>"), "hermes:qwen3"),
        (ModelFacts(special_tokens=HARMONY, chat_template=_template("gpt-oss")), "harmony"),
        (
            ModelFacts(special_tokens=CHATML | HARMONY),
            "harmony",
        ),  # our test vocabulary: SmolLM2's + Harmony's
        (ModelFacts(special_tokens=HARMONY - {"<|constrain|>"}), None),  # not all of them: not Harmony
        (ModelFacts(special_tokens=GLM, chat_template=_template("glm-4.7")), "glm47"),
        (ModelFacts(special_tokens=GLM, chat_template=_template("glm-4.6")), "glm45"),
        # GLM-5.3's template (a "Reasoning Effort:" system header) is not GLM-4.7's: not guessed
        (
            ModelFacts(special_tokens=GLM, chat_template="Reasoning Effort: {{ e }}" + _template("glm-4.7")),
            None,
        ),
        (ModelFacts(special_tokens=GLM), None),  # GLM's vocabulary, no tool template: no family
        (ModelFacts(special_tokens=MISTRAL), "mistral:v3"),
        (ModelFacts(special_tokens=MISTRAL | {"[SYSTEM_PROMPT]"}), "mistral:v3"),  # Nemo's vocab has it too
        (ModelFacts(special_tokens=MISTRAL, chat_template="[SYSTEM_PROMPT]{{ m }}"), "mistral:v7"),
        (
            ModelFacts(special_tokens=MISTRAL | {"[ARGS]", "[CALL_ID]"}, chat_template="[CALL_ID]"),
            "mistral:v11",
        ),
        (ModelFacts(special_tokens=MISTRAL | {"[ARGS]", "[CALL_ID]"}), "mistral:v13"),
        (ModelFacts(special_tokens=MISTRAL, tekken_version="v13"), "mistral:v13"),
        (ModelFacts(special_tokens=MISTRAL | {"<0x0A>", "▁the"}), "mistral:v3_spm"),  # SentencePiece
        (ModelFacts(special_tokens=SPM_V7), "mistral:v7_spm"),
        (  # a chat template that names [SYSTEM_PROMPT] (v7's rule): still SentencePiece
            ModelFacts(special_tokens=SPM_V7, chat_template="[SYSTEM_PROMPT]{{ m }}"),
            "mistral:v7_spm",
        ),
    ],
)
def test_detection(facts: ModelFacts, want: str | None) -> None:
    found = detect_family(facts)
    assert (found.family.ref if found is not None else None) == want


def test_unknown_model_stops_with_the_choices(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(FamilyError) as exc:
        select_family("auto", tmp_path, None)
    for choice in ("hermes", "llama3_json", "mistral:v13", "qwen3_coder"):
        assert choice in str(exc.value)


def test_config_override_wins_and_a_bad_one_names_the_choices(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    assert select_family("mistral:v11", tmp_path, None).family.ref == "mistral:v11"
    with pytest.raises(FamilyError, match="llama3_json"):
        select_family("llama4", tmp_path, None)
    with pytest.raises(FamilyError, match="mistral:v13"):
        load_family("mistral:v99")
    assert {"hermes", "llama3_json", "mistral", "mistral:v3", "qwen3_coder"} <= set(family_choices())


def test_every_family_names_an_envelope_and_test_vocab() -> None:
    for ref in family_choices():
        fam = load_family(ref)
        assert load_envelope(fam.envelope).name == fam.envelope  # a file of grammars/envelopes/
        assert fam.test_model.get("vocab") in {"embedded", "llama3", "tekken", "qwen", "mistral_spm"}


@pytest.mark.parametrize(
    ("vocab_file", "want"),
    [
        ("mistral_instruct_tokenizer_240323.model.v3", "mistral:v3_spm"),  # Mistral 7B v0.3, Mixtral 8x22B
        ("mistral_instruct_tokenizer_241114.model.v7", "mistral:v7_spm"),  # Mistral Large 2411
        ("tekken_240718.json", "mistral:v3"),  # Mistral Nemo: tekken, no byte-fallback tokens
    ],
)
def test_real_mistral_vocabularies_are_told_apart_from_a_model_folder(vocab_file, want, tmp_path) -> None:
    """The folder as the engine loads it (AutoTokenizer over the saved tokenizer), no template, no config."""
    pytest.importorskip("mistral_common")
    if ".model." in vocab_file:
        pytest.importorskip("google.protobuf")
    from transformers import AutoTokenizer

    from server.families.tokenizers import mistral_spm_tokenizer, tekken_file
    from tests.tokenizer_cache import tekken  # converted once, cached on disk by the file's hash

    built = mistral_spm_tokenizer(vocab_file) if ".model." in vocab_file else tekken(tekken_file(vocab_file))
    built.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    found = select_family("auto", tmp_path, tok)
    assert found.family.ref == want, found.how


def test_model_template_gets_the_detected_family_masks(tmp_path) -> None:
    """``model_family: model`` renders with the model's own template; the masks and the parser are
    the detected family's (gpt-oss: harmony and its reasoning, not hermes)."""
    from server.families.test_model import family_test_tokenizer

    (tmp_path / "config.json").write_text('{"model_type": "gpt_oss"}')
    for name in ("template", "model"):  # "model": the older name of the same choice
        found = select_family(name, tmp_path, family_test_tokenizer("harmony")).family
        assert found.name == "template" and found.envelope == "harmony"
        assert found.reasoning == load_family("harmony").reasoning
    # nothing to detect from: no envelope (calls neither masked nor parsed), never hermes by default
    assert select_family("template", None, None).family.envelope == ""
