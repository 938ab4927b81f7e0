"""engine/malloc.py: a forward pass at a width never seen reuses freed heap memory instead of faulting in fresh pages."""
from __future__ import annotations

import platform
import resource

import numpy as np
import pytest

from engine import checkpoint, default_model, malloc, registry
from engine.pipeline import EmbeddingPipeline
from engine.types import Pooling


@pytest.mark.skipif(platform.system() != "Linux" or default_model() is None,
                    reason="glibc's malloc settings; the bundled all-MiniLM-L6-v2")
def test_passes_at_new_widths_do_not_fault_in_fresh_pages():
    assert malloc.description.startswith("glibc malloc keeps freed blocks")
    pipeline = EmbeddingPipeline(registry.load(checkpoint.read(checkpoint.resolve(default_model(), None, False))).model,
                                 Pooling.MEAN)

    def run(rows: int, width: int) -> None:
        ids = np.full((rows, width), 2000, np.int32)
        pipeline(ids, np.ones_like(ids), np.zeros_like(ids), [width] * rows)

    run(4, 160)  # the heap grows to its high-water mark once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for width in (150, 157, 143):  # widths MLX's exact-size buffer cache has not seen
        run(4, width)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    # glibc's defaults: about 30,000 per pass at these widths (a pass's buffers mapped afresh and handed back)
    assert faults < 3 * 2000
