"""The envelope files: they load by name (in another process too), validate, and say what is wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from server.families.envelope import Envelope, load_envelope
from server.package_data import GRAMMARS_DIR

NAMES = sorted(p.stem for p in (GRAMMARS_DIR / "envelopes").glob("*.yaml"))
ROOT = Path(__file__).resolve().parents[2]


def test_the_five_envelopes_are_there():
    assert {"hermes", "llama3_json", "mistral_json_array", "mistral_name_args", "qwen3_coder"} <= set(NAMES)


def test_envelopes_load_by_name_in_another_process(tmp_path):
    """vLLM's engine core rebuilds the constraint from the envelope's name: same envelope there."""
    code = (
        "import json, dataclasses; from server.families.envelope import load_envelope; "
        f"print(json.dumps({{n: dataclasses.asdict(load_envelope(n)) for n in {NAMES!r}}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)
    ours = json.loads(json.dumps({n: asdict(load_envelope(n)) for n in NAMES}))
    assert theirs == ours


def test_derived_strings():
    hermes, mistral = load_envelope("hermes"), load_envelope("mistral_name_args")
    assert (hermes.call_tag, hermes.call_close_tag) == ("<tool_call>", "</tool_call>")
    assert load_envelope("qwen3_coder").call_close_tag == "</tool_call>"
    assert (mistral.trigger_token, mistral.name_close_token) == ("[TOOL_CALLS]", "[ARGS]")
    assert load_envelope("mistral_json_array").opening == '[TOOL_CALLS][{"name": "'
    assert load_envelope("llama3_json").next_opening == load_envelope("llama3_json").opening


@pytest.mark.parametrize(
    "change, message",
    [
        ({"trigger": "magic"}, "trigger"),
        ({"arguments": "yaml"}, "arguments"),
        ({"call_end": "}", "call_id": "[a-z]{3}"}, "call_id"),
        ({"trigger": "token"}, "special token"),
        ({"name_close": ""}, "name_close"),
        ({"call_after_text": False}, "call_after_text"),
        ({"name_close": '"{call_id}", "arguments": ', "call_id": "[a-z]{3}"}, "between two special tokens"),
        ({"name_close": '", "arguments": ', "call_end": "{call_id}}", "call_id": None}, "call_id"),
    ],
)
def test_bad_envelopes_say_what_is_wrong(change, message):
    fields = {**asdict(load_envelope("hermes")), **change}
    with pytest.raises(ValueError, match=message):
        Envelope(**fields)


def test_unknown_fields_and_names_are_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ncall_start: x\nname_open: y\nname_close: z\ncall_end: w\ncolour: red\n")
    with pytest.raises(ValueError, match="colour"):
        load_envelope(str(bad))
    with pytest.raises(ValueError, match="hermes"):
        load_envelope("no_such_envelope")


def test_an_envelope_needs_its_special_tokens(tokenizer):
    """SmolLM2 has no [TOOL_CALLS]: a Mistral envelope on it is refused with the reason."""
    from server.constrain.envelope_compiler import EnvelopeCompiler

    with pytest.raises(ValueError, match=r"\[TOOL_CALLS\]"):
        EnvelopeCompiler(tokenizer, len(tokenizer), load_envelope("mistral_name_args"))
