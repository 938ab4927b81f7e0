"""What every family file shares: config parsing, masks, attention and activations."""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint


@dataclass
class BaseModelArgs:
    @classmethod
    def from_dict(cls, params: dict[str, Any]):
        """Build from config.json, ignoring keys the family does not use."""
        names = inspect.signature(cls).parameters
        return cls(**{k: v for k, v in params.items() if k in names})


def padding_mask(attention_mask: mx.array) -> mx.array:
    """[B, L] 1/0 -> boolean [B, 1, 1, L] (True = attend) for bidirectional attention."""
    return (attention_mask != 0)[:, None, None, :]


_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
# 2^f on [-0.5, 0.5]: Taylor terms of e^(f ln 2); relative error below 4e-6 before normalization.
_EXP2_TERMS = tuple(_LN2 ** k / math.factorial(k) for k in range(7))


def _exp_arithmetic(x: mx.array) -> mx.array:
    """e^x for x <= 0 from arithmetic only: 2^n built from the float's exponent bits times a polynomial."""
    t = mx.maximum(x, -87.0) * _LOG2E
    n = mx.floor(t + 0.5)
    f = t - n
    p = _EXP2_TERMS[-1]
    for c in reversed(_EXP2_TERMS[:-1]):
        p = p * f + c
    return p * mx.view((n.astype(mx.int32) + 127) << 23, mx.float32)


# Not shapeless (the bit view needs shapes); retracing for a new shape costs about a millisecond.
_exp = mx.compile(_exp_arithmetic)


def softmax(scores: mx.array) -> mx.array:
    """Softmax over the last axis with the arithmetic exp (MLX's exp is a scalar loop on a Linux CPU)."""
    weights = _exp(scores - mx.max(scores, axis=-1, keepdims=True))
    return weights * (1.0 / mx.sum(weights, axis=-1, keepdims=True))


def attention(q: mx.array, k: mx.array, v: mx.array, mask: mx.array) -> mx.array:
    """q, k, v as [B, H, L, Dh], boolean mask (True = attend); returns [B, L, H * Dh].

    Written out rather than mx.fast.scaled_dot_product_attention, which is not fused on CPU either and
    measured slower here than matmul + this softmax + matmul. A row with every key masked averages all
    keys instead of producing NaN.
    """
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(0, 1, 3, 2)
    out = softmax(mx.where(mask, scores, -1e30)) @ v
    b, h, length, dh = out.shape
    return out.transpose(0, 2, 1, 3).reshape(b, length, h * dh)


def split_heads(x: mx.array, n_heads: int) -> mx.array:
    """[B, L, H * Dh] -> [B, H, L, Dh]."""
    b, length, d = x.shape
    return x.reshape(b, length, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def gelu_tanh(x: mx.array) -> mx.array:
    return nn.gelu_approx(x)


# erf(x) as a ratio of odd/even polynomials on [-4, 4] (the rational form Eigen and XLA use for float32).
# MLX's erf and exp are scalar loops on a Linux CPU; pure arithmetic fused by mx.compile runs ~7x faster
# (shared/reference/mlx-on-linux.md). Max error against the exact erf GELU: about 1e-6 (tests/engine).
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)


def _gelu_erf_arithmetic(x: mx.array) -> mx.array:
    u = mx.clip(x * 0.7071067811865476, -4.0, 4.0)
    u2 = u * u
    p = _ERF_P[0]
    for c in _ERF_P[1:]:
        p = p * u2 + c
    q = _ERF_Q[0]
    for c in _ERF_Q[1:]:
        q = q * u2 + c
    return x * (0.5 + 0.5 * (u * p) / q)


# shapeless: one compilation serves every batch shape, so a request never waits for a compiler.
gelu_erf = mx.compile(_gelu_erf_arithmetic, shapeless=True)


_ACTIVATIONS = {
    "gelu": gelu_erf,  # erf GELU, as transformers' "gelu" (not the tanh approximation)
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "relu": nn.relu,
    "silu": nn.silu,
    "swish": nn.silu,
}


def activation(name: str):
    """The activation a config names; an unknown one is an error, never a substitute."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise UnsupportedCheckpoint(f"activation {name!r} is not supported "
                                    f"(supported: {', '.join(sorted(_ACTIVATIONS))})") from None
