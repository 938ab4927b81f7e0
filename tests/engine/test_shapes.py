"""engine/runtime/shapes.py: the passes run at startup and the caps fitted to memory by the linear law."""
from __future__ import annotations

import logging
from pathlib import Path

import mlx.core as mx
import pytest

from engine.compute.pipeline import EmbeddingPipeline
from engine.families import kernels
from engine.runtime import shapes
from engine.runtime.scheduler import WARM_MAX, warm_widths
from tests.engine.helpers import start_engine

TINY_QWEN3 = Path("/work/shared/fixtures/gguf/tiny-random-qwen3-last-f16.gguf")
PER_TOKEN = 4096  # bytes of activations one token of the fake runner holds


class FakeRunner:
    """Records the widths it is run at and holds PER_TOKEN bytes per token while it runs."""

    def __init__(self):
        self.widths: list[int] = []

    def __call__(self, ids, mask, type_ids, lengths):
        self.widths.append(ids.shape[1])
        mx.eval(mx.zeros((ids.shape[0] * ids.shape[1] * PER_TOKEN // 4,), dtype=mx.float32))
        return [None] * ids.shape[0]


def _prepare(monkeypatch, available: int, max_seq: int, max_tokens: int = 1 << 20, max_rows: int = 64):
    monkeypatch.setattr(shapes, "available_memory", lambda: available)
    runner = FakeRunner()
    return runner, shapes.prepare(runner, 0, max_seq, max_tokens, max_rows)


def test_a_long_max_seq_runs_no_pass_wider_than_the_warm_set(monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="engine.runtime.shapes"):
        runner, fitted = _prepare(monkeypatch, 64 << 30, max_seq=131072, max_tokens=131072)
    assert "kernels: cpu-arithmetic" in caplog.text  # chosen from the device, before the first pass
    assert runner.widths == warm_widths(131072) == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert max(runner.widths) == WARM_MAX
    assert fitted.max_seq == 131072  # the law says it fits: 131072 tokens x 4 KiB x 1.25 is 640 MiB, plus tiles


def test_widths_beyond_the_warm_set_are_fitted_by_the_linear_law(monkeypatch):
    budget = kernels.transient_bytes() + (100 << 20)
    _, fitted = _prepare(monkeypatch, 2 * budget, max_seq=131072, max_tokens=131072)
    law = (100 << 20) / (PER_TOKEN * shapes.EXTRAPOLATION_MARGIN)  # 20,480 tokens, less the runner's overhead
    assert 0.9 * law <= fitted.max_seq <= law
    assert fitted.max_tokens == fitted.max_seq  # one row of the longest input fills the budget


def test_short_max_seq_is_measured_as_before(monkeypatch):
    runner, fitted = _prepare(monkeypatch, 64 << 30, max_seq=300, max_tokens=4096, max_rows=8)
    assert runner.widths == [8, 16, 32, 64, 128, 256, 300]
    assert (fitted.max_seq, fitted.max_tokens, fitted.max_rows) == (300, 4096, 8)


def test_row_memory_law():
    per_row = {8: 100, 512: 1000, 1024: 2000}
    assert shapes.row_memory(per_row, 512) == 1000
    assert shapes.row_memory(per_row, 600) == 2000  # between warmed widths: the next wider one
    tiles = kernels.transient_bytes()
    assert shapes.row_memory(per_row, 4096) == int(2000 * 4 * shapes.EXTRAPOLATION_MARGIN) + tiles
    assert shapes.longest_fitting(per_row, 8192, 2500) == 1024  # the widest warmed; no room for longer tiles
    assert shapes.longest_fitting(per_row, 8192, tiles + 10_000) == 4096  # 10,000 bytes at 2000 / 1024 * 1.25 a token
    assert shapes.longest_fitting(per_row, 8192, 1 << 40) == 8192
    assert shapes.longest_fitting(per_row, 8192, 50) is None
    assert shapes.longest_fitting({64: 10}, 32, 100, extrapolate=False) == 32  # a fixed width, max_seq below it


@pytest.mark.skipif(not TINY_QWEN3.is_file(), reason="the shared tiny Qwen3 GGUF is not here")
def test_the_tiny_qwen3_serves_its_32k_positions_after_warming_1024(monkeypatch):
    seen: list[int] = []
    real = EmbeddingPipeline.__call__

    def recording(self, ids, *rest):
        seen.append(ids.shape[1])
        return real(self, ids, *rest)

    monkeypatch.setattr(EmbeddingPipeline, "__call__", recording)
    eng = start_engine(TINY_QWEN3, ubatch_tokens=32768, max_batch_tokens=32768)
    try:
        assert max(seen) == WARM_MAX
        assert eng.info.max_input_tokens == 32768 and eng.info.widths[-1] == WARM_MAX
        vector = eng.embed([[785, 3974] * 2000 + [151643]]).vectors[0]  # 4,001 tokens
        assert vector.shape == (64,)
    finally:
        eng.close()
