"""ReplyText: the incremental decode of a reply equals the full decode, token by token, for every
family's tokenizer (byte-level BPE, tiktoken, tekken, SentencePiece)."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.chat.detokenize import INCOMPLETE, ReplyText

TEXT = (
    'I will call the tool now.\n<tool_call>\n{"name": "shell_run", "arguments": {"cmd": "grep -rn '
    "'héllo wörld' src/ | head\"}}\n</tool_call> 日本語のテキスト 🙂🚀 ∑ x² — naïve café\n"
    "  def f(x):\n\treturn x  # tabs, spaces   and\r\n newlines"
)


@functools.cache
def _tokenizer(name: str):
    if name == "embedded":
        from transformers import AutoTokenizer

        from server.model_store import resolve_model

        return AutoTokenizer.from_pretrained(resolve_model("embedded"))
    if name == "mistral_spm":
        pytest.importorskip("sentencepiece")
        from server.families.tokenizers import mistral_spm_tokenizer

        return mistral_spm_tokenizer()
    from tests.constrain.vocabs import load_vocab_tokenizer

    return load_vocab_tokenizer(name)


NAMES = ["embedded", "llama3", "qwen", "tekken_args", "mistral_spm"]


def _pool(tok) -> list[int]:
    """Ids worth drawing: the text's own (byte pieces of emoji and CJK), specials, and some others."""
    ids = list(tok.encode(TEXT, add_special_tokens=False))
    ids += list(tok.all_special_ids)
    ids += list(range(0, 300, 7)) + list(range(1000, 60000, 997))
    return sorted({i for i in ids if i < len(tok)})


@pytest.mark.parametrize("name", NAMES)
def test_the_text_tokens_decode_as_a_whole(name):
    tok = _tokenizer(name)
    ids = tok.encode(TEXT, add_special_tokens=False)
    reply = ReplyText(tok)
    complete_seen = 0
    for i in range(len(ids)):
        text, complete = reply.push(ids[i : i + 1])
        assert text == tok.decode(ids[: i + 1], skip_special_tokens=False)
        assert complete == (not text.endswith(INCOMPLETE))
        complete_seen += complete
    assert text == tok.decode(ids, skip_special_tokens=False)
    if name != "mistral_spm":  # SentencePiece here never shows half a character
        assert complete_seen < len(ids)  # the emoji's bytes came in pieces: the wait was exercised


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_ids_in_any_chunks_decode_as_a_whole(name, data):
    tok = _tokenizer(name)
    pool = _pool(tok)
    ids = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=40))
    reply = ReplyText(tok)
    i = 0
    while i < len(ids):
        n = data.draw(st.integers(1, 4))
        text, complete = reply.push(ids[i : i + n])
        i += n
        full = tok.decode(ids[:i], skip_special_tokens=False)
        assert text == full
        assert complete == (not full.endswith(INCOMPLETE))


def test_a_plain_fast_tokenizer_decodes_through_its_rust_backend_and_one_that_cleans_up_does_not():
    tok = _tokenizer("embedded")
    assert ReplyText(tok)._backend is tok.backend_tokenizer  # transformers' layers skipped
    import copy

    cleaning = copy.copy(tok)
    cleaning.clean_up_tokenization_spaces = True  # decode() would change the text: keep it
    assert ReplyText(cleaning)._backend is None
    reply = ReplyText(tok)
    ids = tok.encode(TEXT, add_special_tokens=False) + [tok.eos_token_id]
    for i in ids:
        text, _ = reply.push([i])
    assert text == tok.decode(ids, skip_special_tokens=False)
