"""Where a GGUF's converted folder and tokenizer folder live in the cache (model_store.py): one per
file, not one per file name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import transformers

from server import model_store
from server.model_store import gguf_cache_name, tokenizer_folder


class Reader:
    """transformers' GGUF tokenizer reader, stood in: the folder it saves names the file it read."""

    def __init__(self, source: Path) -> None:
        self.source = source

    def save_pretrained(self, folder: Path) -> None:
        Path(folder).mkdir(parents=True)
        (Path(folder) / "source.txt").write_text(self.source.read_text())


@pytest.fixture
def reads(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTSERVE_CACHE_DIR", str(tmp_path / "cache"))
    seen: list[Path] = []

    def from_pretrained(folder, gguf_file):
        seen.append(Path(folder) / gguf_file)
        return Reader(Path(folder) / gguf_file)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    monkeypatch.setattr(model_store, "gguf_architecture", lambda gguf: "llama")
    return seen


def gguf(path: Path, content: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return str(path)


def test_two_ggufs_of_one_name_get_their_own_tokenizer_folders(tmp_path, reads):
    small = gguf(tmp_path / "1b" / "Q4_K_M.gguf", "the 1B model")
    large = gguf(tmp_path / "3b" / "Q4_K_M.gguf", "the 3B model")
    a, b = tokenizer_folder(small, progress=False), tokenizer_folder(large, progress=False)
    assert a != b and a.name.startswith("Q4_K_M-") and a.name.endswith(".tokenizer")
    assert (a / "source.txt").read_text() == "the 1B model"
    assert (b / "source.txt").read_text() == "the 3B model"
    assert tokenizer_folder(small, progress=False) == a and len(reads) == 2  # read once per file


def test_a_file_replaced_at_its_path_is_read_again(tmp_path, reads):
    path = tmp_path / "model.gguf"
    first = tokenizer_folder(gguf(path, "old model"), progress=False)
    gguf(path, "a newer, longer model")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    second = tokenizer_folder(str(path), progress=False)
    assert first != second and (second / "source.txt").read_text() == "a newer, longer model"


def test_the_cache_name_depends_on_the_file_not_on_the_way_it_is_named(tmp_path):
    path = Path(gguf(tmp_path / "m.gguf", "x"))
    assert gguf_cache_name(path) == gguf_cache_name(tmp_path / "." / "m.gguf")
    assert gguf_cache_name(path).startswith("m-") and len(gguf_cache_name(path)) == len("m-") + 12


def test_a_converted_folder_is_readable_by_another_uid(tmp_path):
    """The worker image runs as uid 10001: a converted model mounted into it must be readable
    (safetensors writes its file 0600; the vLLM stand-in failed on it with a PermissionError)."""
    folder = tmp_path / "model.tmp"
    (folder / "sub").mkdir(parents=True)
    weights = folder / "model.safetensors"
    weights.write_bytes(b"x")
    weights.chmod(0o600)
    (folder / "sub").chmod(0o700)
    model_store.readable_by_all(folder)
    assert weights.stat().st_mode & 0o777 == 0o644
    assert (folder / "sub").stat().st_mode & 0o777 == 0o755
