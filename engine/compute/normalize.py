"""llama.cpp's common_embd_normalize, bit for bit in the order of its arithmetic, and the Matryoshka cut before it."""
from __future__ import annotations

import numpy as np

from engine.errors import InvalidInput


def check_dimensions(dimensions: object, width: int) -> int:
    """How many components to keep (Matryoshka): `dimensions`, checked against the model's width; None: all.
    The server's `dimensions` field and the Encoder's argument both come through here."""
    if dimensions is None:
        return width
    if isinstance(dimensions, bool) or not isinstance(dimensions, (int, np.integer)) or not 1 <= dimensions <= width:
        raise InvalidInput(f'"dimensions" must be an integer from 1 to {width} (the model\'s embedding width)')
    return int(dimensions)


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
