"""A SPLADE encoder's pooled vectors (one float per vocabulary entry, mostly zeros) as their nonzero entries,
kept to the largest `max_active_dims` as sentence-transformers' SparseEncoder keeps them. Numpy only, on the
caller's thread."""
from __future__ import annotations

import numpy as np

from engine.errors import InvalidInput
from engine.types import SparseVector


def check_max_active_dims(value: object) -> int | None:
    """None, or a positive integer (SparseEncoder.encode's max_active_dims); anything else is InvalidInput."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInput(f"max_active_dims must be a positive integer, not {value!r}")
    return value


def sparsify(vector: np.ndarray, max_active_dims: int | None = None) -> SparseVector:
    """The nonzero entries of `vector`, indices ascending (TEI's order); with max_active_dims, only the that
    many largest by magnitude (sentence-transformers' select_max_active_dims: a top-k of |value|)."""
    vector = np.asarray(vector, dtype=np.float32).ravel()
    indices = np.flatnonzero(vector)
    if max_active_dims is not None and indices.size > max_active_dims:
        # the k largest magnitudes; ties (rare in floats) go to the lower index
        order = np.argsort(-np.abs(vector[indices]), kind="stable")[:max_active_dims]
        indices = np.sort(indices[order])
    return SparseVector(indices=indices.astype(np.int64), values=vector[indices], dimension=int(vector.size))
