"""A sequence classifier's logits as label scores: softmax over the labels, or each label's own sigmoid (a
multi-label head, config.json problem_type multi_label_classification; a one-label cross-encoder), as
transformers' text-classification pipeline applies them. Computed in float64 on the caller's thread."""
from __future__ import annotations

import numpy as np


def label_scores(logits: np.ndarray, multi_label: bool) -> np.ndarray:
    """[labels] logits -> [labels] probabilities."""
    x = np.asarray(logits, dtype=np.float64)
    if multi_label or x.shape[-1] == 1:
        return 0.5 * (1.0 + np.tanh(0.5 * x))  # sigmoid, without overflow
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
