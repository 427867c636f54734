"""A model no family file covers is served as a plain vLLM server serves it (issue 54 item 3):
``model_family: template`` (auto-detection falls back to it when the folder has a chat template)
renders with the model's own chat template; tool calls are masked and parsed by the envelope the
config names (``envelope: NAME``, when its tokens fit the vocabulary), else not at all — said in
the start log and ``GET /v1/models``, and a forced call is a 400 that says how to get one.

The model here is a tiny random-weight Llama with a vocabulary of its own (a byte-level BPE
trained on a few lines, none of the families' special tokens) and a chat template written for
this test, unlike any family's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.chat.family_choice import envelope_name
from server.chat.toolcalls import reply_parser
from server.config import ConfigError, load_settings
from server.families.family import FamilyError
from server.families.select import select_family

pytestmark = pytest.mark.e2e

SPECIALS = ["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>", "<|fn|>"]
# written for this test: tools as "NAME: SCHEMA" lines, calls as <|fn|>NAME(ARGS)
TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|>\nTools:\n{% for t in tools %}{{ t.function.name }}: "
    "{{ t.function.parameters | tojson }}\n{% endfor %}<|end|>\n{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>\n{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "<|fn|>{{ c.function.name }}({{ c.function.arguments | tojson }}){% endfor %}{% else %}"
    "{{ m.content }}{% endif %}<|end|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell_ls",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "enum": ["/", "/tmp"]}},
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    }
]
MODEL = "tiny"


def _tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = ["Tools: shell_ls path tmp. List the files, please.", '{"name": "x", "arguments": {}}'] * 4
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="<|end|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[2:]})
    return tok


@pytest.fixture(scope="module")
def unknown_model(tmp_path_factory) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    out = tmp_path_factory.mktemp("unknown") / "model"
    tok = _tokenizer()
    end = tok.convert_tokens_to_ids("<|end|>")
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=[end],
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.eos_token_id = [end]
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "chat_template.jinja").write_text(TEMPLATE)
    return out


def _client(folder: Path, **overrides):
    from server.app import build_app
    from server.engines.hf.engine import HFEngine
    from server.families.model_facts import load_model_facts

    settings = load_settings(
        model=str(folder), device="cpu", served_model_name=MODEL, tool_state_machine="agent", **overrides
    )
    return TestClient(build_app(settings, engine=HFEngine(settings, load_model_facts(settings, "hf"))))


def _chat(client: TestClient, **extra):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "List the files."}],
        "tools": TOOLS,
        "max_tokens": 24,
        "temperature": 0,
        **extra,
    }
    return client.post("/v1/chat/completions", json=body)


def test_auto_detection_falls_back_to_the_template_without_an_envelope(unknown_model) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(unknown_model)
    for name in ("auto", "template", "model"):
        selection = select_family(name, unknown_model, tok)
        assert selection.family.ref == "template" and selection.family.envelope == ""
    assert "no family file matches" in select_family("auto", unknown_model, tok).how
    assert envelope_name(load_settings(device="cpu"), selection) is None
    assert envelope_name(load_settings(device="cpu", envelope="hermes"), selection) == "hermes"


def test_no_chat_template_still_stops_the_start_with_the_choices(unknown_model, tmp_path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(FamilyError) as err:
        select_family("auto", bare, None)
    assert "mistral:v13" in str(err.value) and "chat_template.jinja" in str(err.value)


def test_without_an_envelope_the_reply_is_text_as_written() -> None:
    parser = reply_parser(None)
    text = '<tool_call>\n{"name": "shell_ls", "arguments": {}}\n</tool_call>'
    assert [e.text for e in parser.feed(text)] == [text]  # type: ignore[union-attr]
    assert parser.finish() == [] and parser.result().content == text and not parser.result().tool_calls


def test_unknown_model_serves_and_says_its_calls_are_not_masked(unknown_model, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="server.chat.service"), _client(unknown_model) as c:
        said = [r.getMessage() for r in caplog.records if "not masked, not parsed" in r.getMessage()]
        assert said and "model family template" in said[0]
        entry = c.get("/v1/models").json()["data"][0]
        assert entry["family"] == "template" and entry["envelope"] is None
        assert (
            entry["tool_calls"].startswith("not masked, not parsed")
            and "envelope: NAME" in entry["tool_calls"]
        )
        # the tools reach the prompt through the model's own template
        shown = c.post(
            "/tokenize",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": TOOLS,
                "return_text": True,
            },
        ).json()
        assert shown["text"].startswith("<s><|system|>\nTools:\nshell_ls: {")
        reply = _chat(c)
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["message"].get("tool_calls") is None and choice["finish_reason"] in ("stop", "length")
        assert reply.json()["tool_state"]["mode"] == "auto"  # the state machine needs masks: not applied
        streamed = _chat(c, stream=True)
        assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
        for forced in ("required", {"type": "function", "function": {"name": "shell_ls"}}):
            refused = _chat(c, tool_choice=forced)
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["param"] == "tool_choice" and "envelope: NAME" in error["message"]
        assert _chat(c, tool_choice="none").status_code == 200


def test_an_envelope_named_in_the_config_masks_and_parses_the_calls(unknown_model) -> None:
    with _client(unknown_model, envelope="hermes") as c:
        entry = c.get("/v1/models").json()["data"][0]
        assert entry["family"] == "template" and entry["envelope"] == "hermes"
        assert entry["tool_calls"] == "masked and parsed (envelope hermes)"
        reply = _chat(c, tool_choice="required", max_tokens=40)
        assert reply.status_code == 200, reply.text
        calls = reply.json()["choices"][0]["message"]["tool_calls"]
        assert calls and calls[0]["function"]["name"] == "shell_ls"
        assert json.loads(calls[0]["function"]["arguments"])["path"] in ("/", "/tmp")


def test_an_envelope_that_does_not_fit_the_vocabulary_stops_the_start(unknown_model) -> None:
    with (
        pytest.raises((ConfigError, ValueError), match=r"\[TOOL_CALLS\]"),
        _client(unknown_model, envelope="mistral_json_array"),
    ):
        pass


def test_a_configured_envelope_s_end_tokens_end_the_reply() -> None:
    """``envelope: gemma4`` on a model no family covers: its <|tool_response> and <turn|> end a reply."""
    from server.families.model_facts import decide

    tok = _tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|tool_response>", "<turn|>"]})  # type: ignore[attr-defined]
    ends = [tok.convert_tokens_to_ids(t) for t in ("<|tool_response>", "<turn|>")]  # type: ignore[attr-defined]
    plain = decide(load_settings(device="cpu", model_family="template"), tok, None)
    assert not set(ends) & set(plain.end_ids) and plain.family.family.envelope == ""
    facts = decide(load_settings(device="cpu", model_family="template", envelope="gemma4"), tok, None)
    assert set(ends) <= set(facts.end_ids)
