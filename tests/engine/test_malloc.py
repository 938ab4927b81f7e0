"""engine/runtime/malloc.py: a forward pass at a width never seen reuses freed heap memory instead of faulting in fresh pages,
and an unloaded model's memory goes back to the system."""
from __future__ import annotations

import os
import platform
import resource

import numpy as np
import pytest

from engine import Engine, EngineOptions, default_model
from engine.runtime import malloc
from engine.loading import formats, hub
from engine.compute.pipeline import EmbeddingPipeline
from engine.types import Pooling


@pytest.mark.skipif(platform.system() != "Linux" or default_model() is None,
                    reason="glibc's malloc settings; the bundled all-MiniLM-L6-v2")
def test_passes_at_new_widths_do_not_fault_in_fresh_pages():
    assert malloc.description.startswith("glibc malloc keeps freed blocks")
    pipeline = EmbeddingPipeline(formats.load(formats.open_checkpoint(hub.resolve(default_model(), None, False))).model,
                                 Pooling.MEAN)

    def run(rows: int, width: int) -> None:
        ids = np.full((rows, width), 2000, np.int32)
        pipeline(ids, np.ones_like(ids), np.zeros_like(ids), [width] * rows)

    run(4, 160)  # the heap grows to its high-water mark once
    faults = []
    for width in (150, 157, 143, 151, 139, 155):  # widths MLX's exact-size buffer cache has not seen
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        run(4, width)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    # glibc's defaults: about 30,000 per pass at these widths (a pass's buffers mapped afresh and handed back),
    # every pass. The fewest, because the count is the whole process's: another engine of the test session
    # unloading (malloc.release) or computing meanwhile faults pages of its own (seen: 1,400-6,500 in a pass).
    assert min(faults) < 1000, faults


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(platform.system() != "Linux" or default_model() is None,
                    reason="glibc's malloc settings; the bundled all-MiniLM-L6-v2")
def test_an_unloaded_model_hands_its_memory_back():
    """The heap keeps freed blocks while serving; an engine that closes trims it, or its weights would stay."""
    before = _rss()
    engine = Engine(EngineOptions(model_path=default_model(), max_seq=32))
    size = engine.wait_loaded(60).size_bytes
    engine.close(wait=True)
    # measured in a fresh process: 25 MB above the start with the trim, 78 MB (most of the weights) without
    assert _rss() - before < 0.5 * size
