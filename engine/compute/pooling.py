"""Per-token hidden states -> one vector per row, outside the family files (every mode honours the mask)."""
from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.types import Pooling


def pool(hidden: mx.array, mask: mx.array, mode: Pooling) -> mx.array:
    """hidden [B, L, D], mask [B, L] (1 = real token) -> [B, D]. Works for left and right padding."""
    hidden = hidden.astype(mx.float32)
    if mode is Pooling.MEAN:
        m = mask.astype(hidden.dtype)[..., None]
        return (hidden * m).sum(axis=1) / mx.maximum(m.sum(axis=1), 1e-9)
    if mode is Pooling.CLS:
        first = mx.argmax(mask, axis=1)
        return mx.take_along_axis(hidden, first[:, None, None], axis=1)[:, 0, :]
    if mode is Pooling.LAST:
        length = mask.shape[1]
        last = length - 1 - mx.argmax(mask[:, ::-1], axis=1)
        return mx.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0, :]
    if mode is Pooling.MAX:
        return mx.where((mask != 0)[..., None], hidden, -mx.inf).max(axis=1)
    raise UnsupportedCheckpoint(f"pooling {mode.value!r} does not produce one vector per input")


def pool_segments(hidden: mx.array, segments: Sequence[Sequence[int]], mode: Pooling) -> mx.array:
    """Late chunking: hidden [L, D] of one input, each segment a list of its rows -> [S, D], each segment pooled
    as `pool` pools a whole input (mean of its rows, its first, its last, their maximum)."""
    hidden = hidden.astype(mx.float32)
    if mode is Pooling.MEAN:  # one matmul: a row of weights 1/n over each segment's rows
        weights = np.zeros((len(segments), hidden.shape[0]), dtype=np.float32)
        for s, rows in enumerate(segments):
            weights[s, list(rows)] = 1.0 / len(rows)
        return mx.array(weights) @ hidden
    if mode is Pooling.CLS:
        return hidden[mx.array([rows[0] for rows in segments])]
    if mode is Pooling.LAST:
        return hidden[mx.array([rows[-1] for rows in segments])]
    if mode is Pooling.MAX:
        return mx.stack([hidden[mx.array(list(rows))].max(axis=0) for rows in segments])
    raise UnsupportedCheckpoint(f"pooling {mode.value!r} does not produce one vector per chunk")


def splade(logits: mx.array, mask: mx.array, strategy: str = "max", activation: str = "relu") -> mx.array:
    """A masked LM's logits [B, L, V], mask [B, L] -> [B, V], as sentence-transformers' SpladePooling computes
    it: log(1 + relu(logit)) of every real token (padding counts as a logit of 0), a second log1p for
    "log1p_relu", then the max (or the sum) over the tokens. log1p and relu never decrease, so the max of the
    transformed logits is the transform of the max logit: max pooling transforms [B, V] values only."""
    real = (mask != 0)[..., None]
    if strategy == "max":
        top = mx.where(real, logits, mx.zeros((), logits.dtype)).max(axis=1).astype(mx.float32)
        out = mx.log1p(mx.maximum(top, 0.0))
        return mx.log1p(out) if activation == "log1p_relu" else out
    out = mx.log1p(mx.maximum(mx.where(real, logits.astype(mx.float32), 0.0), 0.0))
    if activation == "log1p_relu":
        out = mx.log1p(out)
    return out.sum(axis=1)
