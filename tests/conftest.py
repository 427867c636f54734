"""Shared fixtures: the embedded model folder and its tokenizer (converted once, cached)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    from server.model_store import resolve_model

    return resolve_model("embedded", progress=True)


@pytest.fixture(scope="session")
def tokenizer(embedded_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir)
