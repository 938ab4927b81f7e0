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


# The thread count is one setting for the whole process, so the passes computing now are counted here, over every
# engine of the process (several models in router mode), not per engine.
_lock = threading.Lock()
_budget = 0  # threads the passes may keep busy (-t); 0: the library's default, untouched
_computing = 0  # passes computing now


def set_budget(threads: int) -> None:
    """-t: the threads every pass of the process shares (the last engine loaded sets it); <= 0 keeps the default."""
    global _budget
    with _lock:
        _budget = max(0, threads)
        set_threads(_budget)


def pass_started() -> None:
    """A pass starts computing: the BLAS threads are shared out over the passes computing now (a pass alone gets
    them all). Every call is matched by pass_finished."""
    global _computing
    with _lock:
        _computing += 1
        if _budget > 0:
            set_threads(max(1, _budget // _computing))


def pass_finished() -> None:
    global _computing
    with _lock:
        _computing = max(0, _computing - 1)
