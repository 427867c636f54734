"""Give the process's freed heap back to the OS (glibc's ``malloc_trim``).

glibc keeps memory that ``free`` returned for later ``malloc`` calls unless it sits at the very
top of the heap. Start-up leaves a lot of it behind: transformers parses a tokenizer.json (17 MB
for Llama 3's, 280k merges) into Python objects, builds the fast tokenizer and drops them; on the
1B Llama GGUF that left ~157 MB resident that nothing used (RssAnon 454 MB after the tokenizer
load, 295 MB after a trim). ``malloc_trim(0)`` hands every free page back (``MADV_DONTNEED``
inside the heap too, glibc >= 2.8). It costs a walk over the heap's free lists: milliseconds, so
it runs at start-up and when an engine goes idle, never per token.

A no-op (returns False) where the C library has no ``malloc_trim`` (macOS, musl).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim  # the C library this process already runs on
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def can_release() -> bool:
    """Whether this C library has ``malloc_trim`` (glibc)."""
    return _malloc_trim() is not None


def release_free_heap() -> bool:
    """Return freed heap pages to the OS; True when some were returned."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
