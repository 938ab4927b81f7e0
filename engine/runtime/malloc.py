"""Keep freed memory in the C heap instead of handing it back to the kernel after every forward pass.

MLX (CPU) allocates with malloc and caches freed buffers only for an exact size, up to 32 MiB; passes run at
their inputs' exact widths, so most of a pass's buffers are new sizes. glibc serves blocks over its mmap
threshold (128 KiB, growing) from fresh mappings and trims the heap's free top, so those buffers came back as
fresh pages: measured ~38,000 page faults per 4 x 200-token MiniLM pass, a quarter of its CPU time. With the
threshold at its maximum and no trimming, freed blocks are reused from the heap: no faults, the same peak RSS.
An engine that unloads its model hands the heap's free memory back explicitly (release).

Two more settings keep that heap from holding the same memory twice (benchmarks/README.md, "Peak memory, where
it goes"; the bert-tiny cross-encoder server under the rerank load, peak RSS 197 MiB -> 133 MiB):
- One arena for every thread. glibc gives each thread that allocates its own arena (up to 8 a core), and a block
  goes back to the arena it came from: each lane's arena grew to its own high-water mark, the free space of one
  unusable by the other (two lanes: 51 + 62 MiB, 56 MiB of it free). The allocations that take the arena's lock
  are MLX's buffers and request bodies, thousands a second at most; small ones come from each thread's cache.
- No MLX buffer cache on a CPU (drop_mlx_buffer_cache, once MLX is loaded). MLX keeps up to 32 MiB of freed
  buffers for reuse at about the same size; with the heap already keeping every freed block for any size, that
  cache is a second free list beside it, and the heap grew past it for the sizes the cache could not serve.
  A GPU's buffers are not the heap's: there MLX's cache stays as it is.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit: blocks above it still get their own mapping
_TRIM_THRESHOLD = 1 << 30  # free heap top kept up to this much (what a pass used stays at hand for the next)
_ARENAS = 1  # one heap shared by every thread (module docstring)

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
    if not done:
        description = "allocator defaults (mallopt refused)"
        return description
    one_arena = mallopt(_M_ARENA_MAX, _ARENAS) == 1
    description = ("glibc malloc keeps freed blocks (mmap threshold 32 MiB, no trim below 1 GiB, "
                   + ("one arena)" if one_arena else "an arena a thread)"))
    return description


def drop_mlx_buffer_cache() -> None:
    """Where the heap keeps freed blocks and MLX computes on the CPU, turn MLX's own buffer cache off (module
    docstring); process-wide, so every engine's load may call it. Nothing elsewhere (a GPU, or the heap's
    defaults: then MLX's cache is what spares a pass its page faults)."""
    global description
    if _libc is None:
        return
    import mlx.core as mx  # loaded by now: the caller holds a model

    if mx.default_device() != mx.cpu:
        return
    if mx.set_cache_limit(0) != 0:
        description += "; MLX buffer cache off (the heap reuses freed buffers)"


def release() -> None:
    """Hand the heap's free memory back to the kernel (after a model is unloaded: its weights were freed into it)."""
    if _libc is not None:
        _libc.malloc_trim(0)
