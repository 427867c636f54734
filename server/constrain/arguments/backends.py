"""The arguments backends by name (config ``grammar_backend``; the vLLM spec check validates against it).

``outlines`` imports outlines-core only when one is made (``outlines.py``), so listing it costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from server.constrain.arguments.outlines import OutlinesBackend
from server.constrain.arguments.seam import ArgumentsBackend
from server.constrain.arguments.xgrammar import XGrammarBackend
from server.constrain.vocab import TokenVocab

BACKENDS: dict[str, Callable[..., ArgumentsBackend]] = {
    "xgrammar": XGrammarBackend,
    "outlines": OutlinesBackend,
}


def backend_names() -> list[str]:
    """The known backends, sorted."""
    return sorted(BACKENDS)


def make_backend(name: str, vocab: TokenVocab, **options: Any) -> ArgumentsBackend:
    if name not in BACKENDS:
        raise ValueError(f"unknown arguments backend {name!r}: use one of {backend_names()}")
    return BACKENDS[name](vocab, **options)
