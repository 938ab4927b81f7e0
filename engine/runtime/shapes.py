"""Shapes prepared at startup: a few row widths are run once and the row caps are fitted to memory.

Runs on the engine thread before the model is reported loaded. Passes then run at the exact width of their
longest input, any width up to max_seq: every compiled kernel is shapeless, so a new width never waits for a
compiler, and the ones run here have built them.
"""
from __future__ import annotations

import logging
import os

import mlx.core as mx
import numpy as np

from engine.runtime.scheduler import MIN_WIDTH, BatchLimits, warm_widths
from engine.runtime.worker import Runner

log = logging.getLogger(__name__)

# Activations of one forward pass may use this share of the memory available at load time.
MEMORY_SHARE = 0.5


def available_memory() -> int:
    """Bytes of RAM available now (Linux/macOS sysconf; assume 4 GiB where it is unknown)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def prepare(runner: Runner, pad_id: int, max_seq: int, max_tokens: int, max_rows: int,
            fixed_width: int = 0) -> BatchLimits:
    """Warm one row per width of warm_widths, measure its activation memory, and fit the caps to memory.

    Activation memory grows linearly with rows, so the one-row peak of the widest bucket bounds how
    many tokens a pass may hold; max_seq shrinks if even one row of it would not fit.
    """
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
    fitting = [w for w, used in per_row.items() if used <= budget]
    if not fitting:
        raise MemoryError(f"not even one row of {fixed_width or MIN_WIDTH} tokens fits in the memory available")
    fitted_seq = min(max_seq, max(fitting))
    row = fixed_width or fitted_seq  # the widest row a pass can hold
    fitted_tokens = max(row, min(max_tokens, budget // per_row[row] * row))
    fitted_rows = max(1, min(max_rows, budget // per_row[min(per_row)]))
    if (fitted_seq, fitted_tokens, fitted_rows) != (max_seq, max_tokens, max_rows):
        log.info("fitted to %d MiB of memory: max_seq %d (asked %d), batch tokens %d (asked %d), rows %d (asked %d)",
                 budget >> 20, fitted_seq, max_seq, fitted_tokens, max_tokens, fitted_rows, max_rows)
    return BatchLimits(max_tokens=fitted_tokens, max_rows=fitted_rows, max_seq=fitted_seq, fixed_width=fixed_width)

