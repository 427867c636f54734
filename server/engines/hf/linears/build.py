"""A C kernel built once per machine and loaded safely: compiled into the user's cache, loaded by fd.

``build_library(source, flags)`` compiles ``source`` (a ``.c`` file shipped in the package) with
``cc`` into ``kernel_dir()`` as ``NAME-KEY.so``, KEY a hash of the source, the compiler, the
flags, this CPU's flags and the link line: a second start (or a second worker) finds it and
compiles nothing. ``load_library`` loads it.

A loaded ``.so`` runs as our code, so another user must not be able to put one there. The
folder and file are checked on what is OPENED, not on a path that may change in between: the
path is resolved once, then every folder from ``/`` down is opened by fd relative to its parent
(``O_NOFOLLOW``: a component swapped for a symbolic link fails) and checked on that fd
(``fstat``): from the cache root (``AGENTSERVE_CACHE_DIR`` or ``~/.cache/agentserve``) down,
each folder must be ours and writable by no one else; above it, ours or root's, and writable by
others only with the sticky bit (``/tmp``). The ``.so`` is opened relative to the kernel folder's
fd (``O_NOFOLLOW``), checked on its fd (ours, a regular file, no group/other write), copied
from that fd into a private temporary folder (mode 0700) and loaded from there: the very bytes
checked. (Not ``/proc/self/fd/N``: the loader knows a library by its name, and a later kernel
opened on a reused fd number would be handed the first one.) A new build is copied into the
folder through its fd, then renamed in place (atomic: a worker beside this one sees all of it
or nothing).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from server.model_store import cache_dir

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


class UnsafeKernelPath(RuntimeError):
    """A kernel folder or file that another user owns or can write (or a link where a folder was)."""


def kernel_dir() -> Path:
    """Where built kernels live: ``AGENTSERVE_KERNEL_DIR``, else ``kernels`` in the cache folder."""
    return Path(os.environ.get("AGENTSERVE_KERNEL_DIR") or cache_dir() / "kernels")


def compiler() -> str | None:
    """The C compiler: ``$CC``, else ``cc`` or ``gcc`` on PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def torch_gomp() -> Path | None:
    """The ``libgomp`` torch loads (its OpenMP runtime), if torch runs on OpenMP with its own copy."""
    lib = Path(torch.__file__).parent / "lib"
    found = sorted(lib.glob("libgomp*.so*"))
    return found[0] if found and "OpenMP" in torch.__config__.parallel_info() else None


def cpu_flags() -> str:
    """This CPU's feature flags (``/proc/cpuinfo``), else the processor name: part of a build's key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _refuse(where: str, st: os.stat_result, rule: str) -> UnsafeKernelPath:
    return UnsafeKernelPath(
        f"{where} is owned by uid {st.st_uid} with mode {st.st_mode & 0o7777:o}: the kernel is only loaded "
        f"from a folder and file of this user's (uid {os.getuid()}) that no one else can write ({rule}); "
        "fix its owner and mode (chmod go-w) or set AGENTSERVE_KERNEL_DIR to such a folder"
    )


def _check_folder(where: str, st: os.stat_result, strict: bool) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeKernelPath(f"{where} is not a folder")
    writable_by_others = st.st_mode & 0o022
    if strict and (st.st_uid != os.getuid() or writable_by_others):
        raise _refuse(where, st, "the cache folder and every folder below it")
    if not strict and (st.st_uid not in (os.getuid(), 0) or (writable_by_others and not st.st_mode & 0o1000)):
        raise _refuse(where, st, "a folder above the cache: ours or root's, others' writes only if sticky")


@contextmanager
def open_private_folder(folder: Path, root: Path | None = None, create: bool = True) -> Iterator[int]:
    """An fd of ``folder`` (made, mode 0700, if missing and ``create``), every folder on the way
    checked on its own fd (module doc). ``root``: where the strict rule starts (default: the cache
    folder if ``folder`` is inside it, else ``folder`` itself)."""
    if create:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)  # its .so runs as our code: ours only
    path = Path(os.path.realpath(folder))
    top = Path(os.path.realpath(root if root is not None else cache_dir()))
    strict_from = len(top.parts) if path == top or top in path.parents else len(path.parts)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags)
    try:
        _check_folder("/", os.fstat(fd), strict=len(path.parts) <= 1 or strict_from <= 1)
        for depth, name in enumerate(path.parts[1:], start=2):
            try:
                child = os.open(name, flags, dir_fd=fd)
            except OSError as exc:  # ELOOP: the component became a link since realpath
                raise UnsafeKernelPath(
                    f"{Path(*path.parts[:depth])} cannot be opened as a folder: {exc}"
                ) from exc
            os.close(fd)
            fd = child
            _check_folder(str(Path(*path.parts[:depth])), os.fstat(fd), strict=depth >= strict_from)
        yield fd
    finally:
        os.close(fd)


def build_library(source: Path, flags: Sequence[str] = FLAGS, link: Sequence[str] = ()) -> Path:
    """The built ``.so`` of ``source`` in ``kernel_dir()``: compiled now unless a build of the same
    key is there. Raises why it cannot (no compiler, a failed build, an unsafe folder)."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc / gcc) on PATH")
    text = source.read_bytes()
    parts = (text.decode(), cc, *flags, cpu_flags(), *link)
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    folder = kernel_dir()
    name = f"{source.stem}-{key}.so"
    with open_private_folder(folder) as dir_fd:
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            return folder / name
        except FileNotFoundError:
            pass
        with tempfile.TemporaryDirectory() as tmp:  # a private folder of ours (mode 0700)
            out = Path(tmp) / name
            done = subprocess.run(
                [cc, *flags, str(source), "-o", str(out), *link], capture_output=True, text=True, timeout=120
            )
            if done.returncode != 0:
                raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-500:]}")
            staged = f".{name}.{os.getpid()}.tmp"
            # through the checked folder's fd; mode 0755 whatever the umask (group-writable is refused)
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755, dir_fd=dir_fd)
            with os.fdopen(fd, "wb") as dst, open(out, "rb") as built:
                os.fchmod(dst.fileno(), 0o755)
                shutil.copyfileobj(built, dst)
            os.replace(staged, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    return folder / name


def load_library(path: Path) -> ctypes.CDLL:
    """Load the built ``.so`` at ``path``: checked on its fd and loaded from a private copy of that
    fd (module doc). Raises ``UnsafeKernelPath`` for a folder or file others can write, a link, or
    anything but a regular file."""
    with open_private_folder(path.parent, create=False) as dir_fd:
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:  # ELOOP: a link where the .so was
            raise UnsafeKernelPath(f"{path} cannot be opened as a file: {exc}") from exc
    with os.fdopen(fd, "rb") as src:
        st = os.fstat(src.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeKernelPath(f"{path} is not a regular file")
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise _refuse(str(path), st, "the kernel file")
        with tempfile.TemporaryDirectory() as tmp:  # ours, mode 0700: no one else can swap the copy
            copy = Path(tmp) / path.name
            with open(copy, "wb") as dst:
                shutil.copyfileobj(src, dst)
            return ctypes.CDLL(str(copy))  # mapped now: the copy may go
