"""The prefix cache's second tier: where blocks evicted from tier 1 go, and come back from.

Two stores with one interface (``put``/``get``/``discard``), each under a byte budget,
least recently stored/used dropped first:

- ``HostStore``: host RAM (for a CUDA tier 1; tensors kept on the CPU, pinned when CUDA is there);
- ``DiskStore``: one file per block in a local folder (for a CPU tier 1, whose RAM is tier 1).

A disk file holds a small JSON header (the block's chained key, its parent key, its
token ids, shape, dtype, a blake2b checksum of the data) and the raw KV bytes. A block
comes back only when the file's key equals the key asked for, the key is the chained
hash of (parent, tokens), and the checksum matches: a corrupted, truncated or missing
file is a miss, never an error. A write that fails (full disk, unwritable folder)
turns tier 2 off with one warning; serving goes on with one tier. Each worker process writes
into its own folder under ``tier2.path`` (``worker-PID-RANDOM``, mode 0700, files 0600, temp
names unique per write), removes the folders of workers no longer running when it starts, and
its own at shutdown (process exit or the store's collection).

Whether restoring beats recomputing is ``cost_model.CostModel``'s call.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import struct
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from server.kvcache.block_keys import chain_key

log = logging.getLogger(__name__)


class Tier2Store:
    """Byte-budgeted key -> tensor store; ``put`` returns the keys it dropped to stay in budget."""

    kind = "none"

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.enabled = capacity_bytes > 0
        self._sizes: OrderedDict[bytes, int] = OrderedDict()  # least recently used first
        self._devices: dict[bytes, torch.device] = {}  # where each block lived in tier 1 (it goes back there)
        self.used_bytes = 0
        self.bytes_written = 0
        self.bytes_read = 0

    def __contains__(self, key: bytes) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def keys(self) -> list[bytes]:
        """The stored blocks' keys, least recently used first."""
        return list(self._sizes)

    def put(
        self, key: bytes, parent: bytes, tokens: Sequence[int], payload: torch.Tensor, owned: bool = False
    ) -> list[bytes]:
        """Store a block; returns the keys dropped (the LRU ones, or ``key`` itself when it cannot fit).
        ``owned``: the caller hands ``payload`` over (a CPU tensor nobody else writes): host RAM keeps
        it as it is, without a copy (a llamacpp session's state: hundreds of MB, twice at once)."""
        nbytes = payload.numel() * payload.element_size()
        if not self.enabled or nbytes > self.capacity_bytes:
            return [key]
        dropped: list[bytes] = []
        while self.used_bytes + nbytes > self.capacity_bytes and self._sizes:
            old, size = self._sizes.popitem(last=False)
            self._devices.pop(old, None)
            self._delete(old)
            self.used_bytes -= size
            dropped.append(old)
        if not self._write(key, parent, tokens, payload, owned):
            return [*dropped, key]
        self._sizes[key] = nbytes
        self._devices[key] = payload.device
        self.used_bytes += nbytes
        self.bytes_written += nbytes
        return dropped

    def get(self, key: bytes, parent: bytes, tokens: Sequence[int]) -> torch.Tensor | None:
        """The block, removed from this tier, on its tier-1 device; None (and dropped) on any fault."""
        size = self._sizes.pop(key, None)
        if size is None:
            return None
        self.used_bytes -= size
        device = self._devices.pop(key, None)
        try:
            payload = self._read(key, parent, tokens)
            if payload is not None and device is not None:
                payload = payload.to(device)
        except Exception as exc:  # a damaged block is a miss, never an error
            log.warning("tier-2 block %s unreadable (%s): treated as a miss", key.hex(), exc)
            payload = None
        self._delete(key)
        if payload is not None:
            self.bytes_read += size
        return payload

    def discard(self, key: bytes) -> None:
        size = self._sizes.pop(key, None)
        self._devices.pop(key, None)
        if size is not None:
            self.used_bytes -= size
            self._delete(key)

    def clear(self) -> None:
        for key in list(self._sizes):
            self.discard(key)

    # -- storage (subclasses) --------------------------------------------------------
    def _write(
        self, key: bytes, parent: bytes, tokens: Sequence[int], payload: torch.Tensor, owned: bool
    ) -> bool:
        raise NotImplementedError

    def _read(self, key: bytes, parent: bytes, tokens: Sequence[int]) -> torch.Tensor | None:
        raise NotImplementedError

    def _delete(self, key: bytes) -> None:
        raise NotImplementedError


class HostStore(Tier2Store):
    kind = "host"

    def __init__(self, capacity_bytes: int, pin: bool = False) -> None:
        super().__init__(capacity_bytes)
        self.pin = pin
        self._data: dict[bytes, torch.Tensor] = {}

    def _write(
        self, key: bytes, parent: bytes, tokens: Sequence[int], payload: torch.Tensor, owned: bool
    ) -> bool:
        keep = owned and payload.device.type == "cpu" and not self.pin
        host = payload.detach() if keep else payload.detach().to("cpu", copy=True)
        self._data[key] = host.pin_memory() if self.pin else host
        return True

    def _read(self, key: bytes, parent: bytes, tokens: Sequence[int]) -> torch.Tensor | None:
        return self._data.get(key)

    def _delete(self, key: bytes) -> None:
        self._data.pop(key, None)


class DiskStore(Tier2Store):
    kind = "disk"

    def __init__(self, capacity_bytes: int, path: str | Path) -> None:
        super().__init__(capacity_bytes)
        self.root = Path(path)
        self.path = self.root
        if self.enabled:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                _remove_stale_folders(self.root)
                self.path = Path(tempfile.mkdtemp(prefix=f"worker-{os.getpid()}-", dir=self.root))  # 0700
                weakref.finalize(self, shutil.rmtree, str(self.path), True)  # at exit or collection
                probe = self.path / ".agentserve-probe"
                probe.write_bytes(b"ok")
                probe.unlink()
            except OSError as exc:
                self._degrade(f"folder {self.root} is not writable ({exc})")

    def _degrade(self, why: str) -> None:
        log.warning("prefix cache tier 2 off: %s; serving with one tier", why)
        self.enabled = False

    def _file(self, key: bytes) -> Path:
        return self.path / f"{key.hex()}.kv"

    def _write(
        self, key: bytes, parent: bytes, tokens: Sequence[int], payload: torch.Tensor, owned: bool
    ) -> bool:
        t = payload.detach().to("cpu").contiguous()
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header = json.dumps(
            {
                "key": key.hex(),
                "parent": parent.hex(),
                "tokens": list(tokens),
                "shape": list(t.shape),
                "dtype": str(t.dtype).removeprefix("torch."),
                "blake2b": hashlib.blake2b(data, digest_size=16).hexdigest(),
            },
            sort_keys=True,
        ).encode()
        tmp = self.path / f"{key.hex()}.{secrets.token_hex(8)}.tmp"  # no two writes share a name
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(struct.pack("<I", len(header)))
                f.write(header)
                f.write(data)
            os.replace(tmp, self._file(key))
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            self._degrade(f"writing {self._file(key)} failed ({exc})")
            self.clear()
            return False
        return True

    def _read(self, key: bytes, parent: bytes, tokens: Sequence[int]) -> torch.Tensor | None:
        raw = self._file(key).read_bytes()
        (n,) = struct.unpack("<I", raw[:4])
        head = json.loads(raw[4 : 4 + n])
        data = raw[4 + n :]
        if (
            head["key"] != key.hex()
            or head["parent"] != parent.hex()
            or list(head["tokens"]) != list(tokens)
            or chain_key(bytes.fromhex(head["parent"]), head["tokens"]) != key
            or hashlib.blake2b(data, digest_size=16).hexdigest() != head["blake2b"]
        ):
            log.warning("tier-2 block %s failed its check: treated as a miss", key.hex())
            return None
        dtype = getattr(torch, head["dtype"])
        flat = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if data
            else torch.empty(0, dtype=torch.uint8)
        )
        return flat.view(dtype).reshape(head["shape"])

    def _delete(self, key: bytes) -> None:
        try:
            self._file(key).unlink(missing_ok=True)
        except OSError:
            pass


def _remove_stale_folders(root: Path) -> None:
    """Remove the tier-2 folders of worker processes that are no longer running."""
    for folder in root.glob("worker-*-*"):
        pid = folder.name.split("-")[1]
        if folder.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: not ours to judge
    return True


def make_store(memory_mb: int, path: str | None, device_type: str) -> Tier2Store | None:
    """Tier 2 for a tier 1 on ``device_type``: a folder when ``path`` is set, else host RAM."""
    if memory_mb <= 0:
        return None
    cap = memory_mb * 2**20
    if path:
        store: Tier2Store = DiskStore(cap, path)
    else:
        store = HostStore(cap, pin=device_type == "cuda")
    return store if store.enabled else None


def vllm_offload_args(tier2: Any, on_cpu: bool) -> dict[str, Any]:
    """vLLM engine args for ``prefix_cache.tier2`` (vLLM's own KV offloading to host RAM; docs/vllm.md)."""
    if tier2 is None or tier2.memory_mb <= 0:
        return {}
    if on_cpu:
        log.warning(
            "prefix_cache.tier2 ignored on vllm-cpu: vLLM offloads KV to host RAM only from a CUDA "
            "GPU, and on CPU its KV cache is host RAM already (size it with vllm.kv_cache_space_gib)"
        )
        return {}
    if tier2.path:
        log.warning("prefix_cache.tier2.path is an hf-engine setting; vLLM offloads to host RAM")
    return {"kv_offloading_size": tier2.memory_mb / 1024, "kv_offloading_backend": "native"}
