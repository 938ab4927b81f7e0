"""Per-token hidden states -> one vector per row, outside the family files (every mode honours the mask)."""
from __future__ import annotations

import mlx.core as mx

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
