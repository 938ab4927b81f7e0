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


def attention(q: mx.array, k: mx.array, v: mx.array, mask: mx.array) -> mx.array:
    """q, k, v as [B, H, L, Dh]; returns [B, L, H * Dh]."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    b, h, length, dh = out.shape
    return out.transpose(0, 2, 1, 3).reshape(b, length, h * dh)


def split_heads(x: mx.array, n_heads: int) -> mx.array:
    """[B, L, H * Dh] -> [B, H, L, Dh]."""
    b, length, d = x.shape
    return x.reshape(b, length, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def gelu_tanh(x: mx.array) -> mx.array:
    return nn.gelu_approx(x)


_ACTIVATIONS = {
    "gelu": nn.gelu,  # exact erf GELU, as transformers' "gelu"
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
