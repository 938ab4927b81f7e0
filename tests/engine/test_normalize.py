"""engine/compute/normalize.py against a literal transcription of llama.cpp's common_embd_normalize."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine.compute.normalize import normalize_embedding


def llama_normalize(inp: np.ndarray, embd_norm: int) -> np.ndarray:
    """common/common.cpp, element by element: float inputs, a double accumulator, a float factor."""
    inp = [np.float32(v) for v in np.asarray(inp, dtype=np.float32)]
    total = 0.0  # double
    if embd_norm == -1:
        total = 1.0
    elif embd_norm == 0:
        for v in inp:
            if total < abs(float(v)):
                total = abs(float(v))
        total /= 32760.0
    elif embd_norm == 2:
        for v in inp:
            total += float(np.float32(v * v))  # float product, double sum
        total = math.sqrt(total)
    else:
        for v in inp:
            a = abs(float(v))
            total += math.inf if (a == 0.0 and embd_norm < 0) else a ** embd_norm  # std::pow in double
        total = total ** (1.0 / embd_norm) if total != math.inf else (0.0 if embd_norm < 0 else math.inf)
    norm = np.float32(1.0 / total) if total > 0.0 else np.float32(0.0)
    return np.array([np.float32(v * norm) for v in inp], dtype=np.float32)


VECTORS = {
    "gaussian": np.random.default_rng(0).normal(size=384).astype(np.float32),
    "small": (np.random.default_rng(1).normal(size=64) * 1e-3).astype(np.float32),
    "large": (np.random.default_rng(2).normal(size=64) * 1e3).astype(np.float32),
    "one-hot": np.eye(1, 16, 5, dtype=np.float32)[0] * -3.5,
    "mixed-signs": np.array([1.0, -2.0, 3.0, -4.0, 0.0, 0.5], dtype=np.float32),
}


# negative p on vectors with zero components: test_negative_p_with_zero_components
CASES = [(p, name) for p in (-1, 0, 1, 2, 3, 4, -2) for name in VECTORS if p != -2 or np.all(VECTORS[name] != 0)]


@pytest.mark.parametrize("p, name", CASES)
def test_matches_llama(p, name):
    vec = VECTORS[name]
    ours = normalize_embedding(vec, p)
    ref = llama_normalize(vec, p)
    assert ours.dtype == np.float32
    assert ours.shape == vec.shape
    np.testing.assert_array_max_ulp(ours, ref, maxulp=1)


def test_meaning_of_each_p():
    vec = VECTORS["gaussian"]
    np.testing.assert_array_equal(normalize_embedding(vec, -1), vec)
    assert np.abs(normalize_embedding(vec, 0)).max() == pytest.approx(32760.0, rel=1e-6)
    assert not np.array_equal(normalize_embedding(vec, 0), np.round(normalize_embedding(vec, 0)))  # stays float
    assert np.abs(normalize_embedding(vec, 1).astype(np.float64)).sum() == pytest.approx(1.0, rel=1e-6)
    assert np.linalg.norm(normalize_embedding(vec, 2).astype(np.float64)) == pytest.approx(1.0, rel=1e-6)
    three = normalize_embedding(vec, 3).astype(np.float64)
    assert (np.abs(three) ** 3).sum() == pytest.approx(1.0, rel=1e-5)


def test_direction_is_kept():
    vec = VECTORS["mixed-signs"]
    for p in (0, 1, 2, 3):
        out = normalize_embedding(vec, p)
        np.testing.assert_array_equal(np.sign(out), np.sign(vec))
        ratio = out[vec != 0] / vec[vec != 0]
        np.testing.assert_allclose(ratio, ratio[0], rtol=1e-6)


@pytest.mark.parametrize("p", [-2, -1, 0, 1, 2, 3])
def test_zero_vector_stays_zero(p):
    out = normalize_embedding(np.zeros(32, dtype=np.float32), p)
    assert out.dtype == np.float32
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out, np.zeros(32, dtype=np.float32))
    np.testing.assert_array_equal(out, llama_normalize(np.zeros(32), p))


def test_negative_p_with_zero_components():
    # pow(0, -2) = inf in C: the sum is inf, inf^(-1/2) = 0, so the factor is 0 and no NaN appears
    vec = VECTORS["mixed-signs"]
    with np.errstate(all="raise"):
        out = normalize_embedding(vec, -2)
    np.testing.assert_array_equal(out, np.zeros_like(vec))
    np.testing.assert_array_equal(out, llama_normalize(vec, -2))


@pytest.mark.parametrize("p", [-3264409, -2000, 1000, 10**6])
def test_a_p_norm_whose_sum_underflows_or_overflows_gives_zeros(p):
    # components over 1 with a large negative p: the sum underflows to 0 and pow(0, 1/p) is inf in C (Python's
    # 0.0 ** -x raised ZeroDivisionError, a 500); a large positive p overflows the sum to inf: a factor of 0 both ways
    out = normalize_embedding(np.array([2.0, -3.0, 5.5], dtype=np.float32), p)
    np.testing.assert_array_equal(out, np.zeros(3, dtype=np.float32))


def test_empty_vector():
    for p in (-1, 0, 1, 2):
        assert normalize_embedding(np.zeros(0, dtype=np.float32), p).shape == (0,)


def test_input_untouched_and_lists_accepted():
    vec = VECTORS["gaussian"].copy()
    normalize_embedding(vec, 2)
    np.testing.assert_array_equal(vec, VECTORS["gaussian"])
    out = normalize_embedding([3.0, 4.0], 2)
    np.testing.assert_allclose(out, [0.6, 0.8], rtol=1e-7)
