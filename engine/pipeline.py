"""One checkpoint's compute: trunk + pooling, on padded numpy batches. Runs on the engine thread only."""
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

    def __call__(self, ids: np.ndarray, mask: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
        """ids, mask [B, W] right-padded -> one float32 vector [D] per row ([n_i, D] for pooling none)."""
        ids_mx, mask_mx = mx.array(ids), mx.array(mask)
        hidden = self.model(ids_mx, mask_mx)
        if self.pooling is Pooling.NONE:
            out = np.array(hidden.astype(mx.float32))
            return [out[i, :n] for i, n in enumerate(lengths)]
        out = np.array(pool(hidden, mask_mx, self.pooling))
        return list(out)
