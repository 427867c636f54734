"""tests/tokenizer_cache.py: a tekken tokenizer loaded from the test cache is the one a fresh
conversion gives (same class, tokenizer.json, special tokens, ids), and a changed file converts anew."""

from __future__ import annotations

import json

import pytest

from tests import tokenizer_cache

pytest.importorskip("mistral_common")

TEXT = '[INST] héllo wörld 日本語 🙂 [/INST]{"cmd": "ls -la"}</s>[TOOL_CALLS] [ARGS]\n\n  x'


def _small_tekken(path, version: str = "v11"):
    """The bundled tekken file cut to 2,000 BPE ranks (converts in well under a second), with
    v11's special tokens."""
    from server.families.tokenizers import write_tekken

    write_tekken(version, path)
    data = json.loads(path.read_text())
    data["vocab"] = data["vocab"][:2000]
    data["config"].update(num_vocab_tokens=2000, default_vocab_size=3000)
    path.write_text(json.dumps(data))
    return path


def _facts(tok) -> tuple:
    return (
        type(tok),
        json.loads(tok.backend_tokenizer.to_str()),
        tok.special_tokens_map,
        tok.clean_up_tokenization_spaces,
        {i: (t.content, t.special) for i, t in tok.added_tokens_decoder.items()},
        tok(TEXT, add_special_tokens=False)["input_ids"],
        tok.decode(tok(TEXT, add_special_tokens=False)["input_ids"]),
    )


def test_a_cached_tekken_equals_a_fresh_conversion(tmp_path, monkeypatch) -> None:
    from server.families.tokenizers import tekken_tokenizer

    monkeypatch.setenv("AGENTSERVE_CACHE", str(tmp_path / "cache"))
    path = _small_tekken(tmp_path / "tekken.json")
    fresh = tekken_tokenizer.__wrapped__(str(path))
    cached = tokenizer_cache.tekken(path)
    key = tokenizer_cache.tekken_key(path)
    assert (tmp_path / "cache" / "test-tokenizers" / f"tekken-{key}" / "tokenizer.json").is_file()
    assert cached is not fresh and _facts(cached) == _facts(fresh)
    assert tokenizer_cache.tekken(str(path)) is cached  # once per process


def test_the_key_follows_the_file(tmp_path) -> None:
    v11 = _small_tekken(tmp_path / "a.json")
    same = _small_tekken(tmp_path / "b.json")
    v13 = _small_tekken(tmp_path / "c.json", "v13")
    assert tokenizer_cache.tekken_key(v11) == tokenizer_cache.tekken_key(same)
    assert tokenizer_cache.tekken_key(v11) != tokenizer_cache.tekken_key(v13)
