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


def set_budget(threads: int) -> None:
    """-t: the threads every lane of the process shares (the last engine loaded sets it); <= 0 keeps the default."""
    global _budget
    with _lock:
        _budget = max(0, threads)
        set_threads(_budget)
        _lock.notify_all()  # a larger budget admits lanes that wait


def compute_started() -> None:
    """A lane starts computing (its first pass in flight): it waits while -t lanes of the process compute already,
    then the BLAS threads are shared out over the lanes computing now (a lane alone gets them all). Every call is
    matched by compute_finished; a lane never waits here while it holds a pass, so the wait always ends."""
    global _computing
    with _lock:
        while _budget > 0 and _computing >= _budget:
            _lock.wait()
        _computing += 1
        if _budget > 0:
            set_threads(max(1, _budget // _computing))


def compute_finished() -> None:
    """A lane has no pass in flight any more: its share goes to a waiting lane."""
    global _computing
    with _lock:
        _computing = max(0, _computing - 1)
        _lock.notify()
