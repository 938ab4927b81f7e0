"""MaxSim, the late-interaction score of a multi-vector model: for each query row, its best dot product with any
document row, summed over the query rows. Raw (not averaged over the query's rows): it ranks documents for one
query, and with unit rows it is bounded by the query's row count. Asymmetric: the sum runs over the query."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """query [n, d], document [m, d] -> sum_i max_j query_i . document_j."""
    return float((np.asarray(query, np.float32) @ np.asarray(document, np.float32).T).max(axis=1)
                 .astype(np.float64).sum())


def maxsim_scores(query: np.ndarray, documents: Sequence[np.ndarray]) -> list[float]:
    """The query's MaxSim score against each document, in document order."""
    return [maxsim(query, document) for document in documents]
