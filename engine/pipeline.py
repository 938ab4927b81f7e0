"""One checkpoint's compute on padded numpy batches: trunk + pooling, or a scoring head. Engine thread only."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.pooling import pool
from engine.types import Pooling


class EmbeddingPipeline:
    def __init__(self, model: nn.Module, pooling: Pooling):
        self.model = model
        self.pooling = pooling

    def __call__(self, ids: np.ndarray, mask: np.ndarray, type_ids: np.ndarray,
                 lengths: list[int]) -> list[np.ndarray]:
        """[B, W] right-padded -> one float32 vector [D] per row ([n_i, D] for pooling none)."""
        mask_mx = mx.array(mask)
        hidden = self.model(mx.array(ids), mask_mx, mx.array(type_ids))
        if self.pooling is Pooling.NONE:
            out = np.array(hidden.astype(mx.float32))
            return [out[i, :n] for i, n in enumerate(lengths)]
        return list(np.array(pool(hidden, mask_mx, self.pooling)))


class CrossEncoderPipeline:
    """A sequence classifier with one label: the raw logit per (query, document) row."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __call__(self, ids: np.ndarray, mask: np.ndarray, type_ids: np.ndarray,
                 lengths: list[int]) -> list[np.ndarray]:
        logits = self.model(mx.array(ids), mx.array(mask), mx.array(type_ids))
        return list(np.array(logits.astype(mx.float32))[:, 0])
