"""Batching policy, pure: which waiting inputs go into the next forward pass. No threads, no MLX."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


# Inputs of one group may share a pass: texts; a tower's images (their width is their patch count); and
# vision-language inputs holding images, which always run alone (their positions and injected features are
# per sequence). Inputs of different task adapters (jina-embeddings-v3's `task`) never share a pass either.
TEXTS, IMAGES, ALONE = 0, 1, 2


class Waiting(Protocol):
    n_tokens: int
    seq: int  # arrival order
    group: int  # TEXTS | IMAGES | ALONE
    task: int | None  # the task adapter it runs with (None: none); a pass holds one task


MIN_WIDTH = 8  # the narrowest row a pass is charged for
# The row widths run once at load: the narrow one builds every shapeless kernel, and the two measured peaks fit the
# memory law of every other width (engine/runtime/shapes.py), so startup does not grow with the window.
MEASURED_WIDTHS = (16, 64)
MEASURED_TOKENS = 64  # each measured pass holds this many tokens: 4 rows of 16, 1 of 64
WARM_MAX = MEASURED_WIDTHS[-1]  # the widest pass run at load


def warm_widths(max_seq: int, fixed_width: int = 0) -> list[int]:
    """The row widths run once at load (to build the kernels and measure activation memory): MEASURED_WIDTHS,
    each cut to max_seq, whatever the window; just fixed_width when every row has that width. Batches are not
    padded to these: a pass runs at the exact width of its longest input."""
    if fixed_width:
        return [fixed_width]
    return sorted({min(width, max_seq) for width in MEASURED_WIDTHS})


@dataclass(frozen=True)
class BatchLimits:
    max_tokens: int  # rows x width of one pass
    max_rows: int
    max_seq: int | None = None  # the longest input (None before the model is known)
    fixed_width: int = 0  # every row padded to this width (a family trained on one row width); 0 = exact

    def width(self, n_tokens: int) -> int:
        """A pass's row width for its longest input: that input's own length (only real tokens are computed,
        short of the length differences within the pass), or the family's fixed width."""
        return self.fixed_width or n_tokens


def next_batch(waiting: Sequence[Waiting], limits: BatchLimits) -> list[int]:
    """Indices (into `waiting`) of the next batch.

    The oldest input always goes in, so nothing starves. Neighbours of its group and task in length order join it, nearest
    length first, while rows x width (the longest one's length) stays within the token budget and the row cap. An input
    longer than the budget runs alone.
    """
    if not waiting:
        return []
    oldest = min(range(len(waiting)), key=lambda i: waiting[i].seq)
    group, task = waiting[oldest].group, waiting[oldest].task
    if group == ALONE:
        return [oldest]
    order = sorted((i for i in range(len(waiting)) if waiting[i].group == group and waiting[i].task == task),
                   key=lambda i: (waiting[i].n_tokens, waiting[i].seq))
    anchor = order.index(oldest)

    def width_of(n_tokens: int) -> int:
        return limits.width(n_tokens) if group == TEXTS else n_tokens

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
