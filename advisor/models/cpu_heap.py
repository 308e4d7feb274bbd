"""Keep freed memory in the process on a CPU run (glibc's malloc), instead of handing it back to the OS.

Scoring on a CPU allocates and frees the same large tensors at every forward (logits of a batch are
~100 MB for a 49k vocabulary). glibc serves blocks above its mmap threshold (32 MB at most, by default)
with a fresh ``mmap`` and trims the heap's free top, so every such forward faults its pages in again
and the kernel zeroes them (measured: `reports/quickstart/profile_2026-11-27.md`). Raising the threshold and the
trim limit lets the heap reuse those blocks; peak memory is unchanged, the heap just keeps up to
``TRIM_LIMIT`` free. Elsewhere (macOS, musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_LIMIT = 256 * 2**20  # blocks up to this size come from the heap, and are reused there
TRIM_LIMIT = 512 * 2**20  # free memory at the heap's top kept for the next forward
_done = False


def keep_freed_memory() -> bool:
    """Set glibc's mmap threshold and trim limit for this process (once); False where there is no glibc."""
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_LIMIT)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_LIMIT))
    except (OSError, AttributeError):
        return False
    if not ok:
        log.debug("glibc refused the malloc settings; freed memory goes back to the OS as before")
    _done = ok
    return ok
