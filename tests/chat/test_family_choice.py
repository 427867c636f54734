"""The deployment's envelope: the family's own unless the config names one (the default's name too)."""

from __future__ import annotations

from server.chat.family_choice import envelope_name
from server.config import load_settings
from server.families.defaults import DEFAULT_ENVELOPE, DEFAULT_FAMILY
from server.families.family import load_family
from server.families.model_facts import choose_family


def test_the_default_envelope_is_the_default_family_s():
    assert load_family(DEFAULT_FAMILY).envelope == DEFAULT_ENVELOPE


def test_an_unset_envelope_is_the_family_s(tokenizer):
    settings = load_settings(device="cpu", model_family="llama3_json")
    assert settings.envelope is None
    assert envelope_name(settings, choose_family(settings, tokenizer)) == "llama3_json"


def test_an_explicit_default_envelope_is_honoured(tokenizer):
    settings = load_settings(device="cpu", model_family="llama3_json", envelope=DEFAULT_ENVELOPE)
    assert envelope_name(settings, choose_family(settings, tokenizer)) == DEFAULT_ENVELOPE


def test_the_embedded_model_gets_the_default_family(tokenizer):
    settings = load_settings(device="cpu")
    selection = choose_family(settings, tokenizer)
    assert selection.family.name == DEFAULT_FAMILY
    assert envelope_name(settings, selection) == DEFAULT_ENVELOPE
