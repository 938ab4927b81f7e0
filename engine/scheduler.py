"""Batching policy, pure: which waiting inputs go into the next forward pass. No threads, no MLX."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Waiting(Protocol):
    n_tokens: int
    seq: int  # arrival order
    group: int  # only inputs of one group share a pass (0: texts, padded to buckets; else: images, unpadded)


MIN_WIDTH = 8


def padded_width(n_tokens: int, max_seq: int | None = None, half_steps: bool = False) -> int:
    """Rows are padded to the next power of two (at least 8), capped at max_seq: a handful of shapes,
    all prepared at startup, serve every length. With half_steps, the midpoints between powers of two
    (12, 24, 48, ...) are buckets too: at most a third of a row is padding instead of half."""
    width = max(MIN_WIDTH, 1 << max(0, n_tokens - 1).bit_length())
    if half_steps and width > MIN_WIDTH and n_tokens <= width * 3 // 4:
        width = width * 3 // 4
    return min(width, max_seq) if max_seq and n_tokens <= max_seq else width


def width_buckets(max_seq: int, half_steps: bool = False, fixed_width: int = 0) -> list[int]:
    """Every padded width an input of at most max_seq tokens can get (just fixed_width when rows are fixed)."""
    if fixed_width:
        return [fixed_width]
    return sorted({padded_width(n, max_seq, half_steps) for n in range(1, max_seq + 1)})


@dataclass(frozen=True)
class BatchLimits:
    max_tokens: int  # rows x padded width
    max_rows: int
    max_seq: int | None = None  # the widest bucket (None before the model is known)
    half_steps: bool = False  # buckets at 1.5x powers of two too
    fixed_width: int = 0  # every row padded to this width (a family trained on one row width); 0 = buckets

    def width(self, n_tokens: int) -> int:
        if self.fixed_width:
            return self.fixed_width
        return padded_width(n_tokens, self.max_seq, self.half_steps)


def next_batch(waiting: Sequence[Waiting], limits: BatchLimits) -> list[int]:
    """Indices (into `waiting`) of the next batch.

    The oldest input always goes in, so nothing starves. Neighbours in length order join it, nearest
    length first, while rows x padded width stays within the token budget and the row cap. An input
    longer than the budget runs alone.
    """
    if not waiting:
        return []
    oldest = min(range(len(waiting)), key=lambda i: waiting[i].seq)
    group = waiting[oldest].group
    order = sorted((i for i in range(len(waiting)) if waiting[i].group == group),
                   key=lambda i: (waiting[i].n_tokens, waiting[i].seq))
    anchor = order.index(oldest)

    def width_of(n_tokens: int) -> int:
        return limits.width(n_tokens) if group == 0 else n_tokens

    lo = hi = anchor
    width = width_of(waiting[order[anchor]].n_tokens)
    target = waiting[order[anchor]].n_tokens
    can_left = can_right = True
    while hi - lo + 1 < limits.max_rows:
        candidates = []
        if can_left and lo > 0:
            candidates.append((target - waiting[order[lo - 1]].n_tokens, lo - 1))
        if can_right and hi < len(order) - 1:
            candidates.append((waiting[order[hi + 1]].n_tokens - target, hi + 1))
        if not candidates:
            break
        _, pick = min(candidates)
        new_width = max(width, width_of(waiting[order[pick]].n_tokens))
        if (hi - lo + 2) * new_width > limits.max_tokens:
            # A longer neighbour may widen the batch past the budget while a shorter one still fits.
            if pick > hi:
                can_right = False
            else:
                can_left = False
            continue
        width = new_width
        lo, hi = min(lo, pick), max(hi, pick)
    return [order[k] for k in range(lo, hi + 1)]
