"""Bind an optimized BLAS before MLX is first imported.

The Linux `mlx[cpu]` wheel multiplies with the reference (netlib) BLAS it bundles, 30-40x slower than an
optimized one. Loading OpenBLAS with RTLD_GLOBAL before `import mlx.core` makes MLX resolve `cblas_sgemm`
to it (shared/reference/mlx-on-linux.md). macOS uses Accelerate and needs nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
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
