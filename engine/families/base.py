"""What every family file shares: config parsing, masks, attention and activations."""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.families import kernels
from engine.families.kernels import Mask, _exp  # noqa: F401  (_exp: measured by tests/engine/families/test_base.py)

SLIDING_ATTENTION = "sliding_attention"  # transformers' layer_types name of a windowed attention layer


@dataclass
class BaseModelArgs:
    @classmethod
    def from_dict(cls, params: dict[str, Any]):
        """Build from config.json, ignoring keys the family does not use."""
        names = inspect.signature(cls).parameters
        return cls(**{k: v for k, v in params.items() if k in names})


class Trunk(nn.Module):
    """A family's token ids -> hidden states module. What the engine reads off it: its width and position
    capacity (from its args, unless the family says otherwise), and what it declares below; the defaults are a
    plain text trunk's, and a family overrides what differs (as class attributes or properties)."""

    args: BaseModelArgs
    multi_vector: bool = False  # one L2-normalized vector per token (late interaction), projected by the family
    projection_prefix: str | None = None  # a multi-vector family: where a 1_Dense folder's projection goes
    pools_itself: bool = False  # its own heads give one vector per input: the engine's pooling does not apply
    fixed_width: int | None = None  # every row padded to this many tokens (a family trained on one width)
    image_size: int | None = None  # the square image side its vision tower takes; None: no tower (text only)
    image_tokens: int = 0  # what one image counts as in usage and batch budgets (its patches)

    @property
    def hidden_size(self) -> int:
        return self.args.hidden_size

    @property
    def n_positions(self) -> int:
        """Position capacity: the longest input the family can take."""
        return self.args.max_position_embeddings


def padding_mask(attention_mask: mx.array) -> Mask:
    """[B, L] 1/0 -> the bidirectional mask: every query sees the real tokens (dense: [B, 1, 1, L])."""
    return Mask(attention_mask != 0, source=attention_mask)


def softmax(scores: mx.array) -> mx.array:
    """Softmax over the last axis, with the active kernels (engine/families/kernels.py)."""
    return kernels.active().softmax(scores)


def attention(q: mx.array, k: mx.array, v: mx.array, mask: Mask | mx.array, scale: float | None = None,
              bias: mx.array | None = None) -> mx.array:
    """q as [B, H, Lq, Dh], k and v as [B, Hkv, L, Dh] (Hkv divides H: grouped-query attention), and a Mask
    (sequence_mask, padding_mask; .at() for some queries only) or a boolean array [B, 1, Lq or 1, L] (True =
    attend); returns [B, Lq, H * Dh]. scale defaults to 1/sqrt(Dh). bias: added to the scaled scores, [1 or B,
    H, L, L] (relative position biases: MPNet, T5; not with grouped heads), which makes the pass dense.

    Computed by the active kernels (engine/families/kernels.py): on a CPU, a matmul + arithmetic softmax +
    matmul for short inputs and blockwise with an online softmax for long ones (memory linear in the length);
    on a GPU, mx.fast.scaled_dot_product_attention. A row with every key masked stays finite on the CPU set;
    sequence_mask never makes one. Grouped heads broadcast over the shared keys instead of copying them.
    """
    return kernels.active().attention(q, k, v, mask, scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]),
                                      bias)


def relative_position_buckets(length: int, num_buckets: int, max_distance: int) -> np.ndarray:
    """T5's bidirectional bucket of every (query, key) pair of a length-L input, [L, L] int32: half the buckets
    for keys after the query, exact offsets below num_buckets // 4, then log-spaced up to max_distance, then the
    last bucket (MPNet computes the same). The logarithm is taken in float32 as transformers takes it, so an
    offset on a bucket edge falls on the same side."""
    offsets = np.arange(-(length - 1), length)  # k - q
    half = num_buckets // 2
    exact = half // 2
    distance = np.abs(offsets)
    scaled = np.log(np.maximum(distance, 1).astype(np.float32) / exact) / np.float32(math.log(max_distance / exact))
    large = np.minimum(exact + (scaled * (half - exact)).astype(np.int64), half - 1)
    table = (offsets > 0) * half + np.where(distance < exact, distance, large)
    rel = np.arange(length)[None, :] - np.arange(length)[:, None] + (length - 1)
    return table[rel].astype(np.int32)


def split_heads(x: mx.array, n_heads: int) -> mx.array:
    """[B, L, H * Dh] -> [B, H, L, Dh]."""
    b, length, d = x.shape
    return x.reshape(b, length, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def gelu_tanh(x: mx.array) -> mx.array:
    return nn.gelu_approx(x)


def gelu_erf(x: mx.array) -> mx.array:
    """The erf GELU (torch's nn.GELU()), with the active kernels (engine/families/kernels.py)."""
    return kernels.active().gelu_erf(x)


class GeluErf(nn.Module):
    """torch's nn.GELU() (the erf form) as a weightless layer, so a Sequential's list keeps the checkpoint's indices."""

    def __call__(self, x: mx.array) -> mx.array:
        return gelu_erf(x)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (same parameters and checkpoint keys) computed by the active kernels
    (engine/families/kernels.py): mx.fast.layer_norm on a GPU, the same computation in fewer graph nodes on a CPU."""

    def __call__(self, x: mx.array) -> mx.array:
        return kernels.active().layer_norm(x, self.get("weight"), self.get("bias"), self.eps)


_ACTIVATIONS = {
    "gelu": gelu_erf,  # erf GELU, as transformers' "gelu" (not the tanh approximation)
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "quick_gelu": lambda x: x * mx.sigmoid(1.702 * x),  # CLIP's and Qwen2-VL's vision towers
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


# -- decoder backbones: masks and rotary positions ---------------------------------------------------------

def sequence_mask(attention_mask: mx.array, causal: bool, window: int | None = None) -> Mask:
    """[B, L] 1/0 -> the mask of a decoder backbone (dense: boolean [B, 1, L, L], True = attend).

    Keys must be real tokens; causal: a query sees keys at or before it; window: within `window` columns
    (causal: q - k < window; bidirectional: |q - k| < window). Every query also sees itself, so a padding
    row is never fully masked (its output is discarded, but NaN would leak through 0 * NaN).
    """
    return Mask(attention_mask != 0, causal=causal, window=window, diagonal=True, source=attention_mask)


def take_rows(x: mx.array, rows: mx.array) -> mx.array:
    """x [B, L, D] at one position per row (rows [B] int) -> [B, 1, D]."""
    return mx.take_along_axis(x, rows.reshape(-1, 1, 1).astype(mx.int32), axis=1)


def token_positions(attention_mask: mx.array) -> mx.array:
    """Position of each token among the real tokens of its row ([B, L] int32; padding gets a neighbour's)."""
    return mx.maximum(mx.cumsum((attention_mask != 0).astype(mx.int32), axis=1) - 1, 0)


_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_settings(family: str, rope_parameters: dict[str, Any] | None, rope_scaling: dict[str, Any] | None,
                  rope_theta: float | None, default_theta: float) -> dict[str, Any]:
    """One rotary setting from either config style (transformers >= 5 rope_parameters, or rope_theta plus
    rope_scaling); a type we do not compute is an error naming it."""
    params = dict(rope_scaling or {})
    params.update(rope_parameters or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in _ROPE_TYPES:
        raise UnsupportedCheckpoint(f"{family} rope type {kind!r} is not supported (supported: {', '.join(_ROPE_TYPES)})")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedCheckpoint(f"{family} partial_rotary_factor {params['partial_rotary_factor']} is not supported")
    params["rope_type"] = kind
    params["rope_theta"] = float(params.get("rope_theta") or rope_theta or default_theta)
    if kind == "yarn":
        _check_yarn(family, params)
    return params


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _check_yarn(family: str, rope: dict[str, Any]) -> None:
    """YaRN's frequencies are computed here; its attention factor (cos and sin scaled) is not, so only the
    settings where it is 1 are served (Ministral 3's: mscale = mscale_all_dim)."""
    if not rope.get("factor") or not rope.get("original_max_position_embeddings"):
        raise UnsupportedCheckpoint(f"{family} yarn rope needs factor and original_max_position_embeddings")
    factor, mscale, mscale_all_dim = rope["factor"], rope.get("mscale"), rope.get("mscale_all_dim")
    attention_factor = rope.get("attention_factor")
    if attention_factor is None:
        attention_factor = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
                            if mscale and mscale_all_dim else _yarn_mscale(factor))
    if abs(attention_factor - 1.0) > 1e-12:
        raise UnsupportedCheckpoint(f"{family} yarn rope with attention factor {attention_factor:.6g} is not "
                                    f"supported (only 1: mscale equal to mscale_all_dim)")


def _yarn_inverse_frequencies(head_dim: int, rope: dict[str, Any], inv_freq: mx.array) -> mx.array:
    """transformers' _compute_yarn_parameters: the fast bands kept, the slow ones divided by factor, a linear
    ramp between the dimensions that turn beta_fast and beta_slow times over the original context."""
    base, factor = rope["rope_theta"], rope["factor"]
    old_len = rope["original_max_position_embeddings"]

    def dim_of(rotations: float) -> float:
        return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(rope.get("beta_fast") or 32), dim_of(rope.get("beta_slow") or 1)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = mx.clip((mx.arange(head_dim // 2).astype(mx.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # the share of the original (extrapolated) frequency
    return inv_freq / factor * (1 - keep) + inv_freq * keep


def rope_inverse_frequencies(head_dim: int, rope: dict[str, Any]) -> mx.array:
    """Per-pair rotation speeds [Dh / 2] for a rope_settings() dict, as transformers computes them."""
    inv_freq = 1.0 / (rope["rope_theta"] ** (mx.arange(0, head_dim, 2).astype(mx.float32) / head_dim))
    if rope["rope_type"] == "linear":
        return inv_freq / rope["factor"]
    if rope["rope_type"] == "llama3":  # Llama 3.1+: slow bands stretched, fast bands kept, smooth in between
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old_len = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = mx.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return mx.where(medium, smoothed, scaled)
    if rope["rope_type"] == "yarn":
        return _yarn_inverse_frequencies(head_dim, rope, inv_freq)
    return inv_freq


def rotary_tables(positions: mx.array, inv_freq: mx.array) -> tuple[mx.array, mx.array]:
    """cos and sin [B, 1, L, Dh] for token positions [B, L] (rotate-half layout)."""
    angles = positions[..., None].astype(mx.float32) * inv_freq
    angles = mx.concatenate([angles, angles], axis=-1)[:, None]
    return mx.cos(angles), mx.sin(angles)


def rotate(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """Rotary embedding in the rotate-half layout on [B, H, L, Dh]."""
    half = x.shape[-1] // 2
    return x * cos + mx.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


class Rotary:
    """One pass's rotary embedding (rotate-half layout) for one layer kind, applied to [B, H, L, Dh].

    From token positions and rotation speeds: mx.fast.rope with a per-row offset on the fused kernels (the real
    tokens of a row are contiguous, so their positions are their indices less the row's first real index), cos
    and sin tables on the arithmetic ones; from tables (M-RoPE), always the tables. Either is built on first use.
    """

    def __init__(self, positions: mx.array | None = None, inv_freq: mx.array | None = None,
                 attention_mask: mx.array | None = None, tables: tuple[mx.array, mx.array] | None = None,
                 offsets: mx.array | None = None):
        self.positions, self.inv_freq, self.attention_mask = positions, inv_freq, attention_mask
        self._tables = tables
        self._offsets = offsets

    @classmethod
    def from_tables(cls, cos: mx.array, sin: mx.array) -> Rotary:
        return cls(tables=(cos, sin))

    @property
    def fused(self) -> bool:
        return self._tables is None and kernels.active().fused_rope

    def tables(self) -> tuple[mx.array, mx.array]:
        if self._tables is None:
            self._tables = rotary_tables(self.positions, self.inv_freq)
        return self._tables

    def offsets(self) -> mx.array:
        if self._offsets is None:
            self._offsets = -mx.argmax((self.attention_mask != 0).astype(mx.int32), axis=1).astype(mx.int32)
        return self._offsets

    def __call__(self, x: mx.array) -> mx.array:
        if self.fused:
            return mx.fast.rope(x, x.shape[-1], traditional=False, base=None, scale=1.0, offset=self.offsets(),
                                freqs=1.0 / self.inv_freq)
        return rotate(x, *self.tables())

    def at(self, rows: mx.array) -> Rotary:
        """The same embedding for one query per row, at positions rows [B]."""
        if self.fused:
            return Rotary(self.positions, self.inv_freq, offsets=self.offsets() + rows.astype(mx.int32))
        index = rows.reshape(-1, 1, 1, 1).astype(mx.int32)
        cos, sin = self.tables()
        return Rotary.from_tables(*(mx.take_along_axis(t, mx.broadcast_to(index, (t.shape[0], 1, 1, t.shape[-1])),
                                                       axis=2) for t in (cos, sin)))


def checked_layer_types(family: str, layer_types: list[str] | tuple[str, ...], n_layers: int, kinds: tuple[str, ...],
                        window: int | None = None) -> list[str]:
    """`layer_types` as a list when it names one of `kinds` for each of the n_layers layers, and a sliding-attention
    layer has a `window` to slide; otherwise UnsupportedCheckpoint naming what is wrong."""
    types = list(layer_types)
    if len(types) != n_layers or set(types) - set(kinds):
        raise UnsupportedCheckpoint(f"{family} layer_types {types!r} do not describe {n_layers} "
                                    f"{'/'.join(kinds)} layers")
    if SLIDING_ATTENTION in types and not window:
        raise UnsupportedCheckpoint(f"{family}: {SLIDING_ATTENTION} layers without a sliding window")
    return types


def is_bidirectional(model_type: str | None, is_causal: bool | None, use_bidirectional_attention: bool | None) -> bool:
    """A decoder trained without the causal mask (LLM2Vec / Nemotron-embed's llama_bidirec, EmbeddingGemma), as
    its config.json says it; the registry (default pooling) and the families (the mask) both decide by this."""
    return model_type == "llama_bidirec" or is_causal is False or bool(use_bidirectional_attention)


def pixel_shuffle(patches: mx.array, factor: int) -> mx.array:
    """[T, side*side, C] row-major patch states -> [T, (side/factor)^2, C * factor^2]: each factor x factor block
    becomes one token (InternVL's pixel_shuffle v2, Idefics3's connector): a row's neighbours side by side, then
    the block's rows, on a transposed grid transposed back."""
    t, n, c = patches.shape
    side = math.isqrt(n)
    x = patches.reshape(t, side, side // factor, c * factor).transpose(0, 2, 1, 3)
    x = x.reshape(t, side // factor, side // factor, c * factor * factor).transpose(0, 2, 1, 3)
    return x.reshape(t, -1, c * factor * factor)


def place_image_features(embeds: mx.array, is_image: np.ndarray, features: mx.array) -> mx.array:
    """Input embeddings [B, L, D] with the image-token positions (is_image [B, L]) taking the rows of features
    [N, D], in row-major order: how a vision-language family merges its tower's output into the prompt."""
    slots = np.flatnonzero(is_image.reshape(-1))
    if len(slots) != features.shape[0]:
        raise ValueError(f"{len(slots)} image tokens for {features.shape[0]} image features")
    batch, length, width = embeds.shape
    flat = embeds.reshape(batch * length, width)
    flat[mx.array(slots.astype(np.int32))] = features.astype(embeds.dtype)
    return flat.reshape(batch, length, width)


def l2_normalize(vectors: mx.array) -> mx.array:
    """Each vector along the last axis divided by its L2 norm: the multi-vector retrievers' per-token
    normalization. The references all write `proj / proj.norm(dim=-1, keepdim=True)` with no epsilon
    (colpali-engine's ColIdefics3, ColQwen2 and ColQwen2_5, transformers' ColQwen2ForRetrieval), so none is
    added here. The norm is taken in float32, as torch accumulates a half-precision norm, then divides in the
    vectors' dtype."""
    norms = mx.linalg.norm(vectors.astype(mx.float32), axis=-1, keepdims=True)
    return vectors / norms.astype(vectors.dtype)


def without_prefix(key: str, prefixes: tuple[str, ...]) -> str:
    """key less the first of `prefixes` it starts with; unchanged when it starts with none."""
    for prefix in prefixes:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def trunk_weights(weights: dict[str, mx.array], prefixes: tuple[str, ...],
                  roots: tuple[str, ...]) -> dict[str, mx.array]:
    """An encoder's trunk from a checkpoint of the bare model or of a task model around it: each key less the
    task model's prefix for the trunk (without_prefix), and only the keys under the trunk's `roots` kept (a
    task's heads, poolers and buffers are not the trunk)."""
    out = {}
    for key, value in weights.items():
        key = without_prefix(key, prefixes)
        if key.startswith(roots):
            out[key] = value
    return out
