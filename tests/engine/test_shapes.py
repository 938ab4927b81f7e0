"""engine/runtime/shapes.py: the two narrow passes run at startup and the caps fitted to memory by the law
through their peaks, checked against the peaks real models reach at widths that were not run."""
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


def test_a_long_max_seq_runs_two_narrow_passes_only(monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="engine.runtime.shapes"):
        runner, fitted = _prepare(monkeypatch, 64 << 30, max_seq=131072, max_tokens=131072)
    assert "kernels: cpu-arithmetic" in caplog.text  # chosen from the device, before the first pass
    assert runner.widths == warm_widths(131072) == [16, 64]
    assert max(runner.widths) == WARM_MAX
    assert fitted.max_seq == 131072  # the law says it fits: 131072 tokens x 4 KiB x 1.25 is 640 MiB, plus tiles


def test_widths_beyond_the_warm_set_are_fitted_by_the_law(monkeypatch):
    budget = kernels.transient_bytes() + (100 << 20)
    _, fitted = _prepare(monkeypatch, 2 * budget, max_seq=131072, max_tokens=131072)
    law = (100 << 20) / (PER_TOKEN * shapes.EXTRAPOLATION_MARGIN)  # 20,480 tokens, less the runner's overhead
    assert 0.9 * law <= fitted.max_seq <= law
    assert fitted.max_tokens == fitted.max_seq  # one row of the longest input fills the budget


def test_a_short_max_seq_runs_the_same_passes_cut_to_it(monkeypatch):
    runner, fitted = _prepare(monkeypatch, 64 << 30, max_seq=300, max_tokens=4096, max_rows=8)
    assert runner.widths == [16, 64]
    assert (fitted.max_seq, fitted.max_tokens, fitted.max_rows) == (300, 4096, 8)
    runner, fitted = _prepare(monkeypatch, 64 << 30, max_seq=40)
    assert runner.widths == [16, 40] and fitted.max_seq == 40
    runner, fitted = _prepare(monkeypatch, 64 << 30, max_seq=8)
    assert runner.widths == [8] and fitted.max_seq == 8


def test_a_budget_under_the_narrowest_pass_is_refused_with_its_width(monkeypatch):
    with pytest.raises(MemoryError, match="not even one row of 16 tokens"):
        _prepare(monkeypatch, 2 * 16 * PER_TOKEN - 2, max_seq=8192)


def test_row_memory_law():
    per_row = {16: 16 * 100 + 16 ** 2 * 2, 64: 64 * 100 + 64 ** 2 * 2}  # 100 bytes a token, 2 a token squared
    law = shapes.MemoryLaw.fit(per_row)
    assert (law.linear, law.quadratic) == (100, 2)
    tiles = kernels.transient_bytes()
    margin = shapes.EXTRAPOLATION_MARGIN
    assert shapes.row_memory(per_row, 64) == per_row[64]  # measured
    assert shapes.row_memory(per_row, 300) == int((100 * 300 + 2 * 300 ** 2) * margin)  # dense attention
    assert shapes.row_memory(per_row, 4096) == int(100 * 4096 * margin) + tiles  # blockwise: linear, plus tiles
    assert shapes.longest_fitting(per_row, 8192, shapes.row_memory(per_row, 300)) == 300
    # a longer row that would fit is not allowed while a narrower (dense) width does not
    assert shapes.longest_fitting(per_row, 8192, shapes.row_memory(per_row, 400)) == 400
    assert shapes.longest_fitting(per_row, 8192, tiles + int(100 * 4096 * margin)) == 4096
    assert shapes.longest_fitting(per_row, 8192, 1 << 40) == 8192
    assert shapes.longest_fitting(per_row, 8192, per_row[16] - 1) is None
    assert shapes.longest_fitting({64: 10}, 32, 100, extrapolate=False) == 32  # a fixed width, max_seq below it


def test_a_fit_that_comes_out_negative_falls_back_to_the_steepest_share():
    flat = shapes.MemoryLaw.fit({16: 1600, 64: 6300})  # linear, the wider share a little under: no negative square
    assert (flat.linear, flat.quadratic) == (100, 0)
    steep = shapes.MemoryLaw.fit({16: 100, 64: 4096})  # all square: no negative linear share
    assert (steep.linear, steep.quadratic) == (0, 1)
    single = shapes.MemoryLaw.fit({8: 800})
    assert (single.linear, single.quadratic) == (100, 0)


def _peaks_beyond_the_law(monkeypatch, path: Path, widths: list[int], **options) -> list[tuple[int, int, int]]:
    """(width, measured peak, the law's bytes) for each width of `widths` whose one-row peak the law undercharges,
    on a real model loaded as the server loads it (its two narrow passes fit the law), then run at those widths."""
    from engine.runtime import loader
    from engine.types import EngineOptions

    law_from: dict[int, int] = {}
    real_measure = shapes.measure

    def recording(runner, pad_id, width, rows=1):
        law_from[width] = real_measure(runner, pad_id, width, rows)
        return law_from[width]

    monkeypatch.setattr(shapes, "measure", recording)
    runner, served = loader.load(EngineOptions(model_path=str(path), threads=2, **options), 1, 2)
    assert sorted(law_from) == [16, 64]
    law = shapes.MemoryLaw.fit(law_from)
    peaks = [(width, real_measure(runner, served.tokenizer.pad_id, width), law.row(width)) for width in widths]
    return [(width, peak, charged) for width, peak, charged in peaks if peak > charged]


def test_the_law_from_two_narrow_passes_bounds_minilm_at_wider_widths(monkeypatch):
    from tests.conftest import minilm_dir

    assert _peaks_beyond_the_law(monkeypatch, minilm_dir(), [200, 511, 512]) == []  # dense to 511, then blockwise


@pytest.mark.skipif(not TINY_QWEN3.is_file(), reason="the shared tiny Qwen3 GGUF is not here")
def test_the_law_from_two_narrow_passes_bounds_the_tiny_qwen3_at_wider_widths(monkeypatch):
    # blockwise widths only: this model's narrow peaks (tens of KiB) vary by up to 3x from pass to pass with how
    # far ahead MLX has scheduled, so its dense-width charge is not a bound there (MiniLM's and SmolLM2's narrow
    # peaks repeat to the byte); from 512 on the attention tiles' charge covers it many times over
    assert _peaks_beyond_the_law(monkeypatch, TINY_QWEN3, [1024, 2048], ubatch_tokens=4096) == []


@pytest.mark.skipif(not TINY_QWEN3.is_file(), reason="the shared tiny Qwen3 GGUF is not here")
def test_the_tiny_qwen3_serves_its_32k_positions_after_two_narrow_passes(monkeypatch):
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
