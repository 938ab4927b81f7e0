"""engine/compute/pooling.py: every mode through the Engine on MiniLM vs transformers' AutoModel, plus pool() itself."""
from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from engine import Pooling
from engine.compute import pooling
from engine.errors import UnsupportedCheckpoint
from engine.loading.registry import choose_pooling
from tests.engine.helpers import cosine, hf_hidden, load_hf_model, start_engine

TEXTS = [
    "hello",
    "A slightly longer sentence, with punctuation; and numbers like 42 and 3.14.",
    "Café naïve 東京 🙂",
    "the quick brown fox " * 12,
    "",
]
MODES = [Pooling.MEAN, Pooling.CLS, Pooling.LAST, Pooling.MAX, Pooling.NONE]


def reference_pool(hidden: np.ndarray, mode: Pooling) -> np.ndarray:
    """Pooling of one unpadded [n, D] row, written independently of engine/compute/pooling.py."""
    h = hidden.astype(np.float64)
    return {
        Pooling.MEAN: lambda: h.mean(axis=0),
        Pooling.CLS: lambda: h[0],
        Pooling.LAST: lambda: h[-1],
        Pooling.MAX: lambda: h.max(axis=0),
    }[mode]()


@pytest.fixture(scope="module")
def reference(minilm_path):
    return load_hf_model(minilm_path, "AutoModel")


@pytest.fixture(scope="module")
def engines(minilm_path):
    started = {}
    try:
        for mode in MODES:
            started[mode] = start_engine(minilm_path, pooling=mode)
        yield started
    finally:
        for eng in started.values():
            eng.close()


@pytest.fixture(scope="module")
def token_lists(engines):
    return [engines[Pooling.MEAN].encode_prompt([t]) for t in TEXTS]


@pytest.fixture(scope="module")
def hf_states(reference, token_lists):
    return [hf_hidden(reference, ids) for ids in token_lists]


@pytest.mark.parametrize("mode", [Pooling.MEAN, Pooling.CLS, Pooling.LAST, Pooling.MAX], ids=lambda m: m.value)
def test_pooled_vectors_match_transformers(engines, token_lists, hf_states, mode):
    eng = engines[mode]
    assert eng.info.pooling is mode  # --pooling overrides MiniLM's 1_Pooling (mean)
    vectors = eng.embed(token_lists).vectors  # one padded batch: pooling must ignore the padding
    for ids, ours, hidden in zip(token_lists, vectors, hf_states, strict=True):
        expected = reference_pool(hidden, mode)
        assert ours.shape == (384,)
        assert cosine(ours, expected) >= 0.999999, (mode, len(ids))
        np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-4)


def test_pooling_modes_differ(engines, token_lists):
    """Each mode gives its own vector (a mode silently falling back to another would pass the test above
    only if the reference did the same)."""
    ids = token_lists[1]
    vecs = {m: engines[m].embed([ids]).vectors[0] for m in MODES if m is not Pooling.NONE}
    for a in vecs:
        for b in vecs:
            if a is not b:
                assert np.abs(vecs[a] - vecs[b]).max() > 1e-2, (a, b)


def test_none_returns_every_token_row(engines, token_lists, hf_states):
    eng = engines[Pooling.NONE]
    result = eng.embed(token_lists)
    assert result.n_tokens == [len(ids) for ids in token_lists]
    for ids, rows, hidden in zip(token_lists, result.vectors, hf_states, strict=True):
        assert rows.dtype == np.float32
        assert rows.shape == (len(ids), 384)
        np.testing.assert_allclose(rows, hidden, rtol=0, atol=1e-4)


# -- pool() on synthetic states: left and right padding, the mask decides --------------------------------
@pytest.mark.parametrize("mode", [Pooling.MEAN, Pooling.CLS, Pooling.LAST, Pooling.MAX], ids=lambda m: m.value)
@pytest.mark.parametrize("side", ["right", "left"])
def test_pool_honours_mask_on_both_sides(mode, side):
    rng = np.random.default_rng(7)
    lengths = [5, 1, 8, 3]
    width, dim = 8, 6
    hidden = rng.normal(size=(len(lengths), width, dim)).astype(np.float32)
    hidden[:, :, 0] += 50.0  # padding rows hold large values: max/mean would show them
    mask = np.zeros((len(lengths), width), np.int32)
    for row, n in enumerate(lengths):
        if side == "right":
            mask[row, :n] = 1
        else:
            mask[row, width - n:] = 1
    got = np.array(pooling.pool(mx.array(hidden), mx.array(mask), mode))
    for row, n in enumerate(lengths):
        real = hidden[row][mask[row] == 1]
        np.testing.assert_allclose(got[row], reference_pool(real, mode), rtol=1e-6, atol=1e-6)


def test_pool_refuses_modes_without_one_vector():
    h, m = mx.zeros((1, 8, 4)), mx.ones((1, 8), dtype=mx.int32)
    for mode in (Pooling.NONE, Pooling.RANK):
        with pytest.raises(UnsupportedCheckpoint, match=mode.value):
            pooling.pool(h, m, mode)


def test_choose_pooling_precedence():
    def chosen(flag, stored, default):
        checkpoint = SimpleNamespace(pooling=stored, path="model")
        loaded = SimpleNamespace(multi_vector=False, pools_itself=False, default_pooling=default, family="bert")
        return choose_pooling(flag, checkpoint, loaded)

    assert chosen(Pooling.CLS, Pooling.MEAN, Pooling.LAST) is Pooling.CLS  # flag wins
    assert chosen(None, Pooling.MAX, Pooling.MEAN) is Pooling.MAX  # then 1_Pooling
    assert chosen(None, None, Pooling.LAST) is Pooling.LAST  # then the family default
    assert chosen(Pooling.NONE, Pooling.MEAN, Pooling.MEAN) is Pooling.NONE
    assert chosen(Pooling.RANK, Pooling.MEAN, Pooling.MEAN) is Pooling.RANK  # rank mode: the reranker's head
