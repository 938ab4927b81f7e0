"""The arithmetic kernels against the exact functions they replace (errors measured, not assumed)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import engine  # noqa: F401  (binds the BLAS before MLX is used)
from engine.errors import UnsupportedCheckpoint
from engine.families import gemma3_text, lfm2, llama, modernbert, qwen2
from engine.families.base import (_exp, attention, checked_layer_types, gelu_erf, is_bidirectional, l2_normalize,
                                  softmax)
from engine.loading.registry import default_pooling
from engine.types import Pooling
from tests.engine.helpers import torch


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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_l2_normalize_is_the_retrievers_division_by_the_norm(dtype):
    """colpali-engine's and transformers' `proj / proj.norm(dim=-1, keepdim=True)`: in half precision to the bit
    (the norm summed in float32, then rounded to the dtype, as torch does); in float32 within the rounding of a
    different summation order."""
    t = torch()
    x = np.random.default_rng(0).normal(size=(3, 50, 128)).astype(np.float32) * 3
    theirs = t.from_numpy(x).to(getattr(t, dtype))
    expected = (theirs / theirs.norm(dim=-1, keepdim=True)).float().numpy()
    ours = l2_normalize(mx.array(x).astype(getattr(mx, dtype)))
    assert ours.dtype == getattr(mx, dtype)
    if dtype == "float32":
        np.testing.assert_allclose(np.array(ours), expected, rtol=1e-6, atol=0)
    else:
        np.testing.assert_array_equal(np.array(ours.astype(mx.float32)), expected)


def test_layer_types_are_checked_once_for_every_family():
    kinds = ("full_attention", "sliding_attention")
    assert checked_layer_types("X", ("full_attention", "sliding_attention"), 2, kinds, 8) == list(kinds)
    with pytest.raises(UnsupportedCheckpoint, match=r"X layer_types \['full_attention'\] do not describe 2 "
                                                   r"full_attention/sliding_attention layers"):
        checked_layer_types("X", ["full_attention"], 2, kinds, 8)
    with pytest.raises(UnsupportedCheckpoint, match="do not describe 1"):
        checked_layer_types("X", ["conv"], 1, kinds, 8)
    with pytest.raises(UnsupportedCheckpoint, match="X: sliding_attention layers without a sliding window"):
        checked_layer_types("X", ["sliding_attention"], 1, kinds, None)
    # each family goes through it, under its own name
    small = dict(vocab_size=10, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=8)
    for module, name, extra in ((qwen2, "qwen2", {"model_type": "qwen2"}), (gemma3_text, "Gemma 3", {}),
                                (modernbert, "ModernBERT", {}), (lfm2, "LFM2", {})):
        with pytest.raises(UnsupportedCheckpoint, match=f"{name} layer_types \\['odd'\\] do not describe 2"):
            module.ModelArgs.from_dict({**small, **extra, "layer_types": ["odd"]})
    with pytest.raises(UnsupportedCheckpoint, match="Gemma 3: sliding_attention layers without a sliding window"):
        gemma3_text.ModelArgs.from_dict({**small, "sliding_window": None})


@pytest.mark.parametrize("config, bidirectional", [
    ({"model_type": "llama"}, False), ({"model_type": "llama_bidirec"}, True),
    ({"model_type": "llama", "is_causal": False}, True), ({"model_type": "llama", "is_causal": True}, False),
    ({"model_type": "llama", "use_bidirectional_attention": True}, True),
])
def test_one_bidirectional_rule_for_the_mask_and_the_default_pooling(config, bidirectional):
    assert is_bidirectional(config["model_type"], config.get("is_causal"),
                            config.get("use_bidirectional_attention")) is bidirectional
    args = llama.ModelArgs.from_dict({**config, "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
                                      "num_attention_heads": 2, "intermediate_size": 8})
    assert args.causal is not bidirectional
    checkpoint = SimpleNamespace(config=config, model_type=config["model_type"], architecture="LlamaModel")
    assert default_pooling(checkpoint) is (Pooling.MEAN if bidirectional else Pooling.NONE)
