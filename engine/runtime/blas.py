"""Bind an optimized BLAS before MLX is first imported.

The Linux `mlx[cpu]` wheel multiplies with the reference (netlib) BLAS it bundles, 30-40x slower than an
optimized one. Loading OpenBLAS with RTLD_GLOBAL before `import mlx.core` makes MLX resolve `cblas_sgemm`
to it (docs/mlx-on-linux.md). macOS uses Accelerate and needs nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
import threading
from pathlib import Path

_CANDIDATES = (
    # Debian/Ubuntu libopenblas0-pthread (what scripts/setup.sh installs), then other common layouts.
    "/usr/lib/{arch}-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/{arch}-linux-gnu/openblas-openmp/libopenblas.so.0",
    "/usr/lib/{arch}-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

_bound: ctypes.CDLL | None = None
description = "not bound yet"


def bind() -> str:
    """Load OpenBLAS globally if one is installed; return a line saying which BLAS MLX will use."""
    global _bound, description
    if _bound is not None or platform.system() != "Linux":
        if platform.system() != "Linux":
            description = "Accelerate (system default)"
        return description
    if "mlx.core" in sys.modules:
        description = "reference BLAS bundled with mlx (mlx was imported before the binding could run: slow)"
        return description
    arch = platform.machine()
    paths = [p.format(arch=arch) for p in _CANDIDATES]
    found = ctypes.util.find_library("openblas")
    if found:
        paths.append(found)
    for path in paths:
        if "/" in path and not Path(path).exists():
            continue
        try:
            _bound = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        description = f"OpenBLAS ({path})"
        return description
    description = ("reference BLAS bundled with mlx: slow; install OpenBLAS "
                   "(apt-get install libopenblas0-pthread) for a 15x faster engine")
    return description


def set_threads(n: int) -> None:
    """Set the BLAS thread count (MLX itself has no thread setting); n <= 0 keeps the default."""
    if _bound is not None and n > 0:
        _bound.openblas_set_num_threads(ctypes.c_int(n))


# The thread count is one setting for the whole process, so the lanes computing now are counted here, over every
# engine of the process (several models in router mode), not per engine: at most -t lanes compute at once (a lane is
# one thread running its stream's ops, and the BLAS threads it calls are shared out below), so the threads every
# engine keeps busy together stay within -t.
_lock = threading.Condition()
_budget = 0  # threads the lanes may keep busy (-t); 0: the library's default, untouched, and no bound on lanes
_computing = 0  # lanes computing now
_current = 0  # the count last set (0: never set)

# A pass of at most this many token rows (rows x width) computing alone runs on one BLAS thread: its matmuls are
# too small to split (a 17 x 384 x 384 sgemm is ~60 us of work), and the second thread's wake-up and the barrier
# after it cost more, all the more when other processes hold the other core. Measured on this 2-core machine at
# load 7-9 (all-MiniLM-L6-v2 passes, wall p50 of 150 interleaved passes, one thread against two): 1 x 17 tokens
# 101 against 122 ms (best 21.5 against 30.4), and with the process at nice -15 101 against 117 (best 27 against
# 31); 1 x 64 at nice -15 200 against 210, but best 144 against 99, so the line sits below 64.
SMALL_PASS_ROWS = 32


def _apply(threads: int) -> None:
    global _current
    if threads != _current:
        set_threads(threads)
        _current = threads


def set_budget(threads: int) -> None:
    """-t: the threads every lane of the process shares (the last engine loaded sets it); <= 0 keeps the default."""
    global _budget, _current
    with _lock:
        _budget = max(0, threads)
        set_threads(_budget)
        _current = _budget
        _lock.notify_all()  # a larger budget admits lanes that wait


def compute_started() -> None:
    """A lane starts computing (its first pass in flight): it waits while -t lanes of the process compute already.
    Every call is matched by compute_finished; a lane never waits here while it holds a pass, so the wait always
    ends. Its threads are set by pass_starting, at each pass it launches."""
    global _computing
    with _lock:
        while _budget > 0 and _computing >= _budget:
            _lock.wait()
        _computing += 1


def pass_starting(rows: int, behind_another: bool = False) -> None:
    """A computing lane launches a pass of `rows` token rows (`behind_another`: queued behind its pass still
    computing): the BLAS threads are shared out over the lanes computing now (a lane alone gets them all), except
    that a small pass computing alone gets one (SMALL_PASS_ROWS)."""
    with _lock:
        if _budget > 0:
            alone = _computing <= 1 and not behind_another
            _apply(1 if alone and rows <= SMALL_PASS_ROWS else max(1, _budget // max(1, _computing)))


def compute_finished() -> None:
    """A lane has no pass in flight any more: its share goes to a waiting lane."""
    global _computing
    with _lock:
        _computing = max(0, _computing - 1)
        _lock.notify()
