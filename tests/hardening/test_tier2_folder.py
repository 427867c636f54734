"""Tier 2 on disk: one folder per worker (mode 0700, files 0600, temp names that cannot collide),
stale folders of dead workers removed at start, a worker's own folder removed at shutdown. On main,
`serve --workers N` workers shared one folder, wrote `KEY.tmp` names that collided, and left
world-readable KV files (other users' prompts, in KV form) behind forever."""

from __future__ import annotations

import gc
import stat
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from server.kvcache.block_keys import chain_key  # noqa: E402
from server.kvcache.tier2 import DiskStore  # noqa: E402


def _put(store: DiskStore, n: int) -> bytes:
    key = chain_key(b"\0" * 16, [n, n + 1])
    store.put(key, b"\0" * 16, [n, n + 1], torch.arange(8, dtype=torch.float32))
    return key


def test_each_worker_has_its_own_private_folder_and_files(tmp_path):
    a, b = DiskStore(2**20, tmp_path), DiskStore(2**20, tmp_path)
    assert a.path != b.path and a.path.parent == b.path.parent == tmp_path
    ka, kb = _put(a, 1), _put(b, 1)  # the same block in two workers: no shared file, no collision
    assert ka == kb and (a.path / f"{ka.hex()}.kv").is_file() and (b.path / f"{kb.hex()}.kv").is_file()
    assert stat.S_IMODE(a.path.stat().st_mode) == 0o700
    for f in a.path.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert a.get(ka, b"\0" * 16, [1, 2]) is not None


def test_stale_folders_are_removed_at_start_and_a_workers_own_at_shutdown(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f"worker-{dead.stdout.strip()}-abc"
    stale.mkdir()
    (stale / "x.kv").write_bytes(b"old prompt KV")
    store = DiskStore(2**20, tmp_path)
    assert not stale.exists()
    _put(store, 3)
    own = store.path
    assert own.exists()
    del store
    gc.collect()
    assert not own.exists()
    code = (
        "import sys; from server.kvcache.tier2 import DiskStore; s = DiskStore(2**20, sys.argv[1]); "
        "print(s.path)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() and not (tmp_path / out.stdout.strip()).exists()  # removed at exit
