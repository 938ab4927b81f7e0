"""Shapes prepared at startup: two narrow row widths are run once and the row caps are fitted to memory.

Runs on the engine thread before the model is reported loaded. Passes then run at the exact width of their
longest input, any width up to max_seq: every compiled kernel is shapeless or compiled per tile shape (a few),
so a new width never waits for a compiler; the passes run here build the shapeless ones, and MLX keeps every
compiled kernel on disk ($TMPDIR/mlx), so a tile shape is compiled once per machine, by the first input of its
length.

The memory law. One row of width w holds the activations of a pass: hidden states, projections, MLP
intermediates, linear in w, plus attention. Attention is dense, a few [heads, w, w] score matrices of one layer
at a time, so quadratic in w, only below kernels.BLOCKWISE_FROM tokens; from there on it is blockwise
(engine/families/kernels.py: one tile of scores at a time, a size fixed by the tile budget, not by w) or MLX's
fused attention on a GPU (linear as well). So the peak of one row is

    per_row(w) = linear * w + quadratic * w^2                                       for w < BLOCKWISE_FROM,
    per_row(w) = linear * w + kernels.transient_bytes()                             from BLOCKWISE_FROM on,

with the two coefficients fitted through the peaks measured at scheduler.MEASURED_WIDTHS (16 and 64 tokens:
narrow, so the two passes cost a fraction of a second whatever the window). Both passes hold
MEASURED_TOKENS tokens (four rows of 16, one of 64), so what a pass allocates once whatever its width (a
constant the fit through the origin would read as a quadratic share, negative here) counts the same in both
and cancels out of the quadratic coefficient, leaving a slightly steeper linear one. Every width not measured
charged EXTRAPOLATION_MARGIN times its law: the margin covers allocator rounding and what blockwise attention
holds per token beyond the dense path's (padded q, k, v), transient_bytes the widest attention tiles a row may
use (they stop growing at kernels.MAX_TILE_KEYS keys). Where a fit through two points comes out negative (noise
on a linear runner), the law falls back to the steepest measured share, linear or quadratic. Activation memory
grows linearly with rows, so the one-row peak of the widest row bounds how many tokens a pass may hold; max_seq
shrinks to the longest row that fits (every narrower one fitting too) if max_seq itself would not. Startup time
and memory do not grow with --max-seq, -c or -ub.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from engine.families import kernels
from engine.runtime.scheduler import MEASURED_TOKENS, BatchLimits, warm_widths
from engine.runtime.worker import Runner

log = logging.getLogger(__name__)

# Activations of one forward pass may use this share of the memory available at load time.
MEMORY_SHARE = 0.5
# A width not measured is charged this much more than its law (module docstring).
EXTRAPOLATION_MARGIN = 1.25


def available_memory() -> int:
    """Bytes of RAM available now (Linux/macOS sysconf; assume 4 GiB where it is unknown)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 << 30


@dataclass(frozen=True)
class MemoryLaw:
    """Activation bytes of one row by its width: the measured peaks, and the law of the module docstring for
    every other width."""

    measured: dict[int, int]
    linear: float  # bytes per token
    quadratic: float  # bytes per token squared (dense attention's score matrices, below BLOCKWISE_FROM)

    @classmethod
    def fit(cls, measured: dict[int, int]) -> MemoryLaw:
        """Through the two widest measured peaks (a single peak: linear alone)."""
        widths = sorted(measured)
        if len(widths) == 1:
            return cls(dict(measured), measured[widths[0]] / widths[0], 0.0)
        w1, w2 = widths[-2], widths[-1]
        share1, share2 = measured[w1] / w1, measured[w2] / w2  # = linear + quadratic * w
        quadratic = (share2 - share1) / (w2 - w1)
        linear = share1 - quadratic * w1
        if quadratic < 0:
            quadratic, linear = 0.0, max(share1, share2)
        elif linear < 0:
            quadratic, linear = max(measured[w] / w ** 2 for w in widths), 0.0
        return cls(dict(measured), linear, quadratic)

    def row(self, width: int) -> int:
        """One row's bytes: measured when it was, else the law with the margin."""
        if width in self.measured:
            return self.measured[width]
        if width < kernels.BLOCKWISE_FROM:
            return int((self.linear * width + self.quadratic * width * width) * EXTRAPOLATION_MARGIN)
        return int(self.linear * width * EXTRAPOLATION_MARGIN) + kernels.transient_bytes()

    def longest(self, max_seq: int, budget: int) -> int | None:
        """The longest width up to max_seq whose one row fits in `budget`, every narrower width fitting too
        (None: not even the narrowest measured one)."""
        narrowest = min(self.measured)
        if self.row(min(narrowest, max_seq)) > budget:
            return None
        top_dense = min(max_seq, kernels.BLOCKWISE_FROM - 1)
        if top_dense <= narrowest:
            longest = min(narrowest, max_seq)
        else:
            longest = _widest_fitting(self.row, narrowest, top_dense, budget)
        if longest < top_dense or max_seq < kernels.BLOCKWISE_FROM:
            return longest
        if self.row(kernels.BLOCKWISE_FROM) > budget:
            return longest
        return _widest_fitting(self.row, kernels.BLOCKWISE_FROM, max_seq, budget)


def _widest_fitting(row, lo: int, hi: int, budget: int) -> int:
    """The widest width in [lo, hi] with row(width) <= budget, row growing with the width and row(lo) fitting."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if row(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def row_memory(per_row: dict[int, int], width: int) -> int:
    """Activation bytes of one row of `width` by the law fitted through the measured peaks `per_row`."""
    return MemoryLaw.fit(per_row).row(width)


def longest_fitting(per_row: dict[int, int], max_seq: int, budget: int, extrapolate: bool = True) -> int | None:
    """The longest width up to max_seq whose one row fits in `budget` (None: not even the narrowest measured
    one); beyond the measured widths by the law when `extrapolate` (else max_seq when the widest measured fits)."""
    if not extrapolate:
        widest = max(per_row)
        return min(max_seq, widest) if per_row[widest] <= budget else None
    return MemoryLaw.fit(per_row).longest(max_seq, budget)


def measure(runner: Runner, pad_id: int, width: int, rows: int = 1) -> int:
    """The activation bytes of one row of `width`: the peak of one pass of `rows` such rows beyond what was
    allocated before it, shared out between them."""
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    ids = np.full((rows, width), pad_id, dtype=np.int32)
    runner(ids, np.ones((rows, width), np.int32), np.zeros((rows, width), np.int32), [width] * rows)
    return max(1, -(-(mx.get_peak_memory() - base) // rows))


def prepare(runner: Runner, pad_id: int, max_seq: int, max_tokens: int, max_rows: int,
            fixed_width: int = 0) -> BatchLimits:
    """Choose the kernels for the device, warm one row per width of warm_widths, measure its activation
    memory, and fit the caps to memory by the law above."""
    log.info("kernels: %s (device %s)", kernels.select().name, mx.default_device())
    budget = int(available_memory() * MEMORY_SHARE)
    per_row: dict[int, int] = {}
    for width in warm_widths(max_seq, fixed_width):
        per_row[width] = measure(runner, pad_id, width, 1 if fixed_width else max(1, MEASURED_TOKENS // width))
        if per_row[width] > budget:
            break
    law = MemoryLaw.fit(per_row)
    fitted_seq = longest_fitting(per_row, max_seq, budget, extrapolate=False) if fixed_width else \
        law.longest(max_seq, budget)
    if fitted_seq is None:
        raise MemoryError(f"not even one row of {min(per_row)} tokens fits in the memory available")
    row = fixed_width or fitted_seq  # the widest row a pass can hold
    fitted_tokens = max(row, min(max_tokens, budget // law.row(row) * row))
    fitted_rows = max(1, min(max_rows, budget // per_row[min(per_row)]))
    log.debug("memory law from %s: %.0f bytes a token, %.3f a token squared below %d tokens",
              per_row, law.linear, law.quadratic, kernels.BLOCKWISE_FROM)
    if (fitted_seq, fitted_tokens, fitted_rows) != (max_seq, max_tokens, max_rows):
        log.info("fitted to %d MiB of memory: max_seq %d (asked %d), batch tokens %d (asked %d), rows %d (asked %d)",
                 budget >> 20, fitted_seq, max_seq, fitted_tokens, max_tokens, fitted_rows, max_rows)
    return BatchLimits(max_tokens=fitted_tokens, max_rows=fitted_rows, max_seq=fitted_seq, fixed_width=fixed_width)
