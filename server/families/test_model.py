"""``agentserve make-test-model --family NAME OUT``: a tiny random-weight model of a family.

The folder holds a small Llama-architecture model with RANDOM weights (it writes nonsense,
which the masks turn into valid tool calls) and the family's REAL tokenizer, built offline
from the official vocabulary (server/families/tokenizers.py; ``hermes`` uses the embedded
SmolLM2 tokenizer; ``harmony`` the same plus the Harmony special tokens). config.json records
``agentserve_family`` so the server picks the family without guessing. Serve it with
``agentserve serve --model OUT``: every family runs on a laptop CPU, end to end.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from server.families.family import load_family
from server.families.tokenizers import build_tokenizer
from server.package_data import GRAMMARS_DIR


def _tokenizer(vocab: str, version: str | None, tmp: Path) -> Any:
    if vocab == "tekken" and version:
        from server.families.tokenizers import tekken_tokenizer, write_tekken

        tmp.mkdir(parents=True, exist_ok=True)
        return tekken_tokenizer(str(write_tekken(version, tmp / "tekken.json")))
    if vocab == "embedded":
        from transformers import AutoTokenizer

        from server.model_store import resolve_model

        return AutoTokenizer.from_pretrained(resolve_model("embedded"))
    return build_tokenizer(vocab)


def family_test_tokenizer(family_ref: str, tmp: Path | None = None) -> Any:
    """The tokenizer a test model of the family gets: its ``test_model.vocab``, plus the special
    tokens listed in ``test_model.add_special`` (Harmony's, on the SmolLM2 vocabulary: the o200k
    vocabulary cannot be fetched here) and the text tokens of ``test_model.add_tokens`` (GLM's tags)."""
    family = load_family(family_ref)
    spec = family.test_model
    tok = _tokenizer(str(spec.get("vocab", "embedded")), family.version, tmp or Path("."))
    added = [str(t) for t in spec.get("add_special") or ()]
    if added:
        tok.add_tokens(added, special_tokens=True)
    plain = [str(t) for t in spec.get("add_tokens") or ()]  # one token each, decoded as text (GLM's tags)
    if plain:
        tok.add_tokens(plain)
    if spec.get("bos"):  # the family's begin-of-sequence token (DeepSeek's), one of add_special
        tok.bos_token = str(spec["bos"])
    return tok


def make_test_model(
    family_ref: str,
    out: str | Path,
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
    max_positions: int | None = None,
) -> Path:
    """Write the model folder at ``out`` (replaced if it exists); returns its path.

    ``max_positions`` sets the context window (default: the family's ``test_model.max_positions``,
    else 8,192); agent clients such as Claude Code send 12-20k-token prompts and need 32k+.
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    family = load_family(family_ref)
    spec = family.test_model
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = family_test_tokenizer(family_ref, tmp)
    eos = [tok.convert_tokens_to_ids(t) for t in spec.get("eos", [tok.eos_token])]
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions or int(spec.get("max_positions", 8192)),
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.config.agentserve_family = family.ref
    model.generation_config.eos_token_id = eos
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if spec.get("chat_template"):  # a family whose prompt is the model's own template (Gemma 4)
        template = GRAMMARS_DIR / "templates" / f"{spec['chat_template']}.jinja"
        (tmp / "chat_template.jinja").write_text(template.read_text())
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
