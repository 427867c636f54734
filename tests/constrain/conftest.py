"""Fixtures for the masking tests: the Hermes envelope, a constraint compiler, tool sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# 44 names chosen to be awkward: prefixes of each other, digits, dots, dashes, shared
# prefixes, case, a leading underscore, single letters.
TRICKY_NAMES = (
    "shell", "shell_exec", "shell_exec_async", "shell_exec_async2", "sh", "s",
    "open", "open_site", "opener", "open-site", "open.site", "open_site_v2",
    "browser_open", "browser_open2", "browser_open22", "browser_click", "browser_close",
    "browser_clickx", "browser.navigate", "browser-back",
    "file_read", "file_read_v2", "file_read_v2.1", "file_readlines", "file_write",
    "a", "a1", "a_1", "a.b", "ab", "abc",
    "x.y.z", "x.y", "get-user", "getUser", "GetUser", "get_user_by_id",
    "_private", "__init__", "tool9", "tool99", "tool_9_9", "search_dir", "search_directory",
)  # fmt: skip


def load_tools(name: str) -> list[dict]:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="session")
def swe_tools() -> list[dict]:
    return load_tools("swe_agent_tools.json")


@pytest.fixture(scope="session")
def prefixed_tools() -> list[dict]:
    return load_tools("prefixed_agent_tools.json")


@pytest.fixture(scope="session")
def hermes():
    from server.families.envelope import load_envelope

    return load_envelope("hermes")


@pytest.fixture(scope="session")
def vocab(tokenizer):
    from server.constrain.vocab import TokenVocab

    return TokenVocab.from_tokenizer(tokenizer, len(tokenizer))


BACKENDS = ("xgrammar", "outlines")  # every arguments backend passes the same masking tests


@pytest.fixture(scope="session", params=BACKENDS)
def compiler(request, tokenizer, vocab, hermes):
    """A Hermes constraint compiler on the embedded vocabulary, once per arguments backend."""
    from server.constrain.envelope_compiler import EnvelopeCompiler

    return EnvelopeCompiler(tokenizer, vocab.vocab_size, hermes, backend=request.param, vocab=vocab)


# --- the model families' real vocabularies (tests/constrain/vocabs.py) ---------------------------------
# envelope -> (vocabulary, end-of-sequence tokens). Both Mistral envelopes use the tekken vocabulary
# with [ARGS]/[CALL_ID] (an extra special token does not change the v3 JSON-array format).
FAMILIES = {
    "hermes": ("qwen", ("<|im_end|>", "<|endoftext|>")),
    "qwen3_coder": ("qwen", ("<|im_end|>", "<|endoftext|>")),
    "llama3_json": ("llama3", ("<|eot_id|>", "<|eom_id|>")),
    "mistral_json_array": ("tekken_args", ("</s>",)),
    "mistral_name_args": ("tekken_args", ("</s>",)),
    "mistral_call_id": ("tekken_args", ("</s>",)),
    "mistral_json_array_spm": ("mistral_spm", ("</s>",)),
}


class Official:
    """One real vocabulary: its tokenizer, TokenVocab (built once per session) and compilers."""

    def __init__(self, name: str) -> None:
        from server.constrain.vocab import TokenVocab

        from .vocabs import LOGITS_WIDTH, load_vocab_tokenizer

        self.name = name
        self.tokenizer = load_vocab_tokenizer(name)
        self.vocab = TokenVocab.from_tokenizer(self.tokenizer, LOGITS_WIDTH[name])
        self._factories: dict[str, object] = {}

    def compiler(self, envelope: str):
        from server.constrain.envelope_compiler import EnvelopeCompiler
        from server.families.envelope import load_envelope

        if envelope not in self._factories:
            self._factories[envelope] = EnvelopeCompiler(
                self.tokenizer, self.vocab.vocab_size, load_envelope(envelope), vocab=self.vocab
            )
        return self._factories[envelope]

    def eos(self, envelope: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.convert_tokens_to_ids(t) for t in FAMILIES[envelope][1])


_OFFICIAL: dict[str, Official] = {}


@pytest.fixture(scope="session")
def official():
    """official(name) -> Official, built at most once per session (tokenizer.json cached on disk)."""

    def get(name: str) -> Official:
        if name not in _OFFICIAL:
            _OFFICIAL[name] = Official(name)
        return _OFFICIAL[name]

    return get
