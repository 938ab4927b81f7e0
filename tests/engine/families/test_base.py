"""The arithmetic kernels against the exact functions they replace (errors measured, not assumed)."""
from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

import engine  # noqa: F401  (binds the BLAS before MLX is used)
from engine.families.base import _exp, attention, gelu_erf, softmax


def test_gelu_matches_the_exact_erf_gelu():
    x = np.linspace(-12, 12, 200_001, dtype=np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    got = np.array(gelu_erf(mx.array(x)))
    assert np.abs(got - exact).max() < 2e-6
    # and it is not the tanh approximation, which is off by ~1e-3 near |x| = 2
    assert np.abs(np.array(nn.gelu_approx(mx.array(x))) - exact).max() > 1e-4


def test_exp_relative_error():
    x = np.linspace(-80, 0, 100_001, dtype=np.float32)
    got = np.array(_exp(mx.array(x))).astype(np.float64)
    assert (np.abs(got - np.exp(x.astype(np.float64))) / np.exp(x.astype(np.float64))).max() < 5e-6
    assert float(np.array(_exp(mx.array([-1e30], dtype=mx.float32)))[0]) < 1e-37  # masked scores vanish


def test_softmax_matches_mlx_softmax():
    scores = mx.random.normal((4, 3, 17, 33), key=mx.random.key(0)) * 8
    np.testing.assert_allclose(np.array(softmax(scores)), np.array(mx.softmax(scores, axis=-1)), atol=1e-6)


def test_attention_matches_the_reference_and_respects_the_mask():
    key = mx.random.key(1)
    q, k, v = (mx.random.normal((2, 4, 9, 8), key=kk) for kk in mx.random.split(key, 3))
    mask = mx.array([[True] * 9, [True] * 5 + [False] * 4])[:, None, None, :]
    reference = mx.fast.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(8), mask=mask)
    got = attention(q, k, v, mask).reshape(2, 9, 4, 8).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(np.array(got), np.array(reference), atol=1e-5)
    # a fully masked row stays finite (no NaN leaking into the next layer)
    none = mx.zeros((2, 1, 1, 9), dtype=mx.bool_)
    assert np.isfinite(np.array(attention(q, k, v, none))).all()
