"""Shapes prepared at startup: a few row widths are run once and the row caps are fitted to memory.

Runs on the engine thread before the model is reported loaded. Passes then run at the exact width of their
longest input, any width up to max_seq: every compiled kernel is shapeless or compiled per tile shape (a few),
so a new width never waits for a compiler, and the passes run here have built them.

The memory law. One row of width w holds activations of a pass: hidden states, projections, MLP
intermediates, all linear in w, plus attention. Attention is dense (quadratic in w) only below
kernels.BLOCKWISE_FROM tokens; from there on it is blockwise (engine/families/kernels.py: one tile of scores
at a time, a size fixed by the tile budget, not by w) or MLX's fused attention on a GPU (linear as well), so
per-row memory is linear in w beyond that width. Startup therefore runs the warm widths only (powers of two
up to scheduler.WARM_MAX = 1024, or max_seq when shorter) and measures each one's peak; a longer max_seq is
fitted from the widest warmed width W (>= BLOCKWISE_FROM, so on the linear law) as

    per_row(w) = per_row(W) * w / W * EXTRAPOLATION_MARGIN + kernels.transient_bytes()   for W < w <= max_seq.

The line through the origin also scales W's constant part (buffers, W's own tiles), which only overestimates a
longer row; the margin covers allocator rounding, and transient_bytes the widest attention tiles a longer row
may use (they stop growing at kernels.MAX_TILE_KEYS keys). Activation
memory grows linearly with rows, so the one-row peak of the widest row bounds how many tokens a pass may hold;
max_seq shrinks to the longest row that fits if max_seq itself would not. Startup time and memory no longer grow
with --max-seq.
"""
from __future__ import annotations

import logging
import os

import mlx.core as mx
import numpy as np

from engine.families import kernels
from engine.runtime.scheduler import MIN_WIDTH, BatchLimits, warm_widths
from engine.runtime.worker import Runner

log = logging.getLogger(__name__)

# Activations of one forward pass may use this share of the memory available at load time.
MEMORY_SHARE = 0.5
# A width longer than the warm set is charged this much more than its linear share of the widest warm width.
EXTRAPOLATION_MARGIN = 1.25


def available_memory() -> int:
    """Bytes of RAM available now (Linux/macOS sysconf; assume 4 GiB where it is unknown)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def row_memory(per_row: dict[int, int], width: int) -> int:
    """Activation bytes of one row of `width`: measured when it was warmed, else the linear law from the widest
    warmed width (module docstring)."""
    if width in per_row:
        return per_row[width]
    widest = max(per_row)
    if width < widest:  # between warmed widths: the next wider one bounds it
        return per_row[min(w for w in per_row if w >= width)]
    return int(per_row[widest] * width / widest * EXTRAPOLATION_MARGIN) + kernels.transient_bytes()


def longest_fitting(per_row: dict[int, int], max_seq: int, budget: int, extrapolate: bool = True) -> int | None:
    """The longest width up to max_seq whose one row fits in `budget` (None: not even the narrowest warmed one);
    beyond the widest warmed width by the linear law when `extrapolate`."""
    fitting = [w for w, used in per_row.items() if used <= budget]
    if not fitting:
        return None
    widest = max(per_row)
    room = budget - kernels.transient_bytes()
    if extrapolate and max_seq > widest and per_row[widest] <= room:
        fitting.append(max(widest, int(room / (per_row[widest] / widest * EXTRAPOLATION_MARGIN))))
    return min(max_seq, max(fitting))


def prepare(runner: Runner, pad_id: int, max_seq: int, max_tokens: int, max_rows: int,
            fixed_width: int = 0) -> BatchLimits:
    """Choose the kernels for the device, warm one row per width of warm_widths, measure its activation
    memory, and fit the caps to memory by the law above."""
    log.info("kernels: %s (device %s)", kernels.select().name, mx.default_device())
    budget = int(available_memory() * MEMORY_SHARE)
    per_row: dict[int, int] = {}
    for width in warm_widths(max_seq, fixed_width):
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        ids = np.full((1, width), pad_id, dtype=np.int32)
        runner(ids, np.ones((1, width), np.int32), np.zeros((1, width), np.int32), [width])
        per_row[width] = max(1, mx.get_peak_memory() - base)
        if per_row[width] > budget:
            break
    fitted_seq = longest_fitting(per_row, max_seq, budget, extrapolate=not fixed_width)
    if fitted_seq is None:
        raise MemoryError(f"not even one row of {fixed_width or MIN_WIDTH} tokens fits in the memory available")
    row = fixed_width or fitted_seq  # the widest row a pass can hold
    fitted_tokens = max(row, min(max_tokens, budget // row_memory(per_row, row) * row))
    fitted_rows = max(1, min(max_rows, budget // per_row[min(per_row)]))
    if (fitted_seq, fitted_tokens, fitted_rows) != (max_seq, max_tokens, max_rows):
        log.info("fitted to %d MiB of memory: max_seq %d (asked %d), batch tokens %d (asked %d), rows %d (asked %d)",
                 budget >> 20, fitted_seq, max_seq, fitted_tokens, max_tokens, fitted_rows, max_rows)
    return BatchLimits(max_tokens=fitted_tokens, max_rows=fitted_rows, max_seq=fitted_seq, fixed_width=fixed_width)
