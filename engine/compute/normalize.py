"""A request's vectors finished as it asked, for the server and the Python API alike: the Matryoshka cut
(`dimensions`), then llama.cpp's common_embd_normalize (`embd_normalize`), bit for bit in the order of its
arithmetic."""
from __future__ import annotations

import numpy as np

from engine.errors import InvalidInput


MULTI_VECTOR_DIMENSIONS = ('"dimensions" is not supported by a multi-vector model: its token vectors keep their '
                           '{width} dimensions (the width its MaxSim scores were trained on)')


def check_dimensions(dimensions: object, width: int, multi_vector: bool = False) -> int:
    """How many components to keep (Matryoshka): `dimensions`, checked against the model's width; None: all.
    A multi-vector model refuses any. The server's `dimensions` field and the Encoder's argument both come
    through here."""
    if dimensions is None:
        return width
    if multi_vector:
        raise InvalidInput(MULTI_VECTOR_DIMENSIONS.format(width=width))
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
        # as C's pow: a negative p on a zero component, or a sum that underflows to 0, gives inf, then a factor
        # of 0; an overflowing sum too
        with np.errstate(divide="ignore", over="ignore", under="ignore"):
            total = float(np.sum(np.abs(x.astype(np.float64)) ** p) ** (1.0 / p))
    norm = np.float32(1.0 / total) if total > 0 else np.float32(0.0)
    return x * norm


def finish(vector: np.ndarray, embd_normalize: int, dimensions: int | None) -> np.ndarray:
    """One embedding as a request asks for it: a pooled vector's first `dimensions` components (None: all),
    normalized as `embd_normalize` says; per-token rows (pooling none) each cut the same and never normalized,
    as llama leaves them (a multi-vector model's rows, normalized by the model, refuse `dimensions`)."""
    kept = vector if dimensions is None else vector[..., :dimensions]
    return normalize_embedding(kept, embd_normalize) if kept.ndim == 1 else kept
