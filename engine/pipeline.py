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


class GenerativeRerankPipeline:
    """A causal LM scored by the yes/no recipe: sigmoid(logit_yes - logit_no) at the last position.

    Only the final hidden state of the last position meets the LM head, and only its two rows: the
    difference of the logits is h . (W_yes - W_no), so no [B, L, vocab] tensor is ever built.
    """

    def __init__(self, model: nn.Module, yes_id: int, no_id: int, pad_id: int):
        rows = model.head_rows([yes_id, no_id])
        self.model = model
        self.direction = rows[0] - rows[1]
        self.pad_id = pad_id

    def __call__(self, ids: np.ndarray, mask: np.ndarray, type_ids: np.ndarray,
                 lengths: list[int]) -> list[np.ndarray]:
        # Rows arrive right-padded; decoders take them left-padded so every row ends at the last position.
        width = ids.shape[1]
        left_ids = np.full_like(ids, self.pad_id)
        left_mask = np.zeros_like(mask)
        for row, n in enumerate(lengths):
            left_ids[row, width - n:] = ids[row, :n]
            left_mask[row, width - n:] = 1
        hidden = self.model(mx.array(left_ids), mx.array(left_mask))[:, -1, :]
        return list(np.array(mx.sigmoid(hidden.astype(mx.float32) @ self.direction.astype(mx.float32))))
