"""Keep freed memory in the C heap instead of handing it back to the kernel after every forward pass.

MLX (CPU) allocates with malloc and caches freed buffers only for an exact size, up to 32 MiB; passes run at
their inputs' exact widths, so most of a pass's buffers are new sizes. glibc serves blocks over its mmap
threshold (128 KiB, growing) from fresh mappings and trims the heap's free top, so those buffers came back as
fresh pages: measured ~38,000 page faults per 4 x 200-token MiniLM pass, a quarter of its CPU time. With the
threshold at its maximum and no trimming, freed blocks are reused from the heap: no faults, the same peak RSS.
An engine that unloads its model hands the heap's free memory back explicitly (release).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit: blocks above it still get their own mapping
_TRIM_THRESHOLD = 1 << 30  # free heap top kept up to this much (what a pass used stays at hand for the next)

description = "not set"
_libc: ctypes.CDLL | None = None


def keep_freed_memory() -> str:
    """Set glibc's malloc thresholds (Linux); return a line saying what was done."""
    global description, _libc
    if platform.system() != "Linux":
        description = "system allocator defaults (not Linux)"
        return description
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.malloc_trim  # noqa: B018  (release needs it: without it the settings would keep memory for good)
    except (OSError, AttributeError):
        description = "allocator defaults (no glibc mallopt)"
        return description
    done = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
    _libc = libc if done else None
    description = ("glibc malloc keeps freed blocks (mmap threshold 32 MiB, no trim below 1 GiB)" if done
                   else "allocator defaults (mallopt refused)")
    return description


def release() -> None:
    """Hand the heap's free memory back to the kernel (after a model is unloaded: its weights were freed into it)."""
    if _libc is not None:
        _libc.malloc_trim(0)
