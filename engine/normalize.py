"""llama.cpp's common_embd_normalize, bit for bit in the order of its arithmetic."""
from __future__ import annotations

import numpy as np


def normalize_embedding(vec: np.ndarray, p: int) -> np.ndarray:
    """-1: unchanged; 0: max |x| scaled to 32760 (stays float); 2: L2; any other p: p-norm (1 = L1).

    A zero (or degenerate) vector stays all zeros, never NaN.
    """
    x = np.asarray(vec, dtype=np.float32)
    if p == -1:
        total = 1.0
    elif p == 0:
        total = float(np.max(np.abs(x))) / 32760.0 if x.size else 0.0
    elif p == 2:
        total = float(np.sqrt(np.sum((x * x).astype(np.float64))))  # product in float, sum in double
    else:
        with np.errstate(divide="ignore"):  # negative p on a zero component: inf, then 0, as in C
            total = float(np.sum(np.abs(x.astype(np.float64)) ** p)) ** (1.0 / p)
    norm = np.float32(1.0 / total) if total > 0 else np.float32(0.0)
    return x * norm
