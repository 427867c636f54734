"""Converted tekken tokenizers, shared across test modules and runs (the main suite's time).

``server.families.tokenizers.tekken_tokenizer`` converts a tekken.json with transformers'
``MistralConverter`` (~5 s on 2 cores: it rebuilds the BPE merges of 131k ids). The Mistral
tests convert the same bundled vocabulary re-labelled v3 / v7 / v11 / v13 / v13_think, in
several modules, each from its own tmp path. ``tekken(path)`` converts a file once: the result
is saved under ``$AGENTSERVE_CACHE/test-tokenizers/tekken-KEY`` (default ``~/.cache/agentserve``)
and loaded from there (~1 s) by later modules and runs. KEY hashes everything the conversion
depends on: the file's bytes, the converting code's source and the transformers / tokenizers
versions, so a changed file, converter or library converts afresh.

The loaded tokenizer is the same class as a fresh one (``PreTrainedTokenizerFast``) with the
same tokenizer.json and special tokens (tests/test_tokenizer_cache.py). One object per KEY and
process: callers must not mutate it (``add_tokens``); copy it first (``copy.deepcopy``).
"""

from __future__ import annotations

import hashlib
import inspect
import os
from functools import cache
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    root = Path(os.environ.get("AGENTSERVE_CACHE") or Path.home() / ".cache" / "agentserve")
    return root / "test-tokenizers"


def tekken_key(path: str | Path) -> str:
    """The hash of what converting ``path`` depends on (its bytes, our converter, the libraries)."""
    import tokenizers
    import transformers

    from server.families import tokenizers as ours

    h = hashlib.sha256(Path(path).read_bytes())
    for part in (
        inspect.getsource(ours.tekken_tokenizer),
        inspect.getsource(ours._fast),
        transformers.__version__,
        tokenizers.__version__,
    ):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:20]


def tekken(path: str | Path | None = None) -> Any:
    """``tekken_tokenizer(path)`` (default: the bundled tekken_240911.json), converted once."""
    from server.families.tokenizers import tekken_file

    return _load(tekken_key(path or tekken_file()), str(path or tekken_file()), cache_root())


@cache
def _load(key: str, path: str, root: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    folder = root / f"tekken-{key}"
    if not (folder / "tokenizer.json").is_file():
        from server.families.tokenizers import tekken_tokenizer

        tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
        tekken_tokenizer.__wrapped__(path).save_pretrained(tmp)  # not the product's per-process memo
        if folder.exists():  # another process finished first: same key, same content
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)
