"""Qwen3-VL's vision tower (engine/families/qwen3_vl.py's `model.visual`): a ViT over 16 px patches.

It embeds flattened (C, T, P, P) patches with one matmul, adds learned positions resampled bilinearly
(align-corners) from a square table to the image's grid, and runs pre-norm LayerNorm blocks with 2-D rotary
attention (height angles then width angles, engine/families/mrope.py's axial_rotary) inside each image. Patches
arrive in 2x2 merge-block order, so the merger simply concatenates four neighbours: LayerNorm -> Linear -> GELU
-> Linear into the decoder's width. DeepStack: after the blocks listed in `deepstack_visual_indexes` the hidden
states go through their own merger; the decoder adds those features to the image tokens' hidden states.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.families.base import BaseModelArgs, LayerNorm, activation, rotate, softmax
from engine.families.mrope import Grid, axial_rotary, merge_block_positions


@dataclass
class VisionArgs(BaseModelArgs):
    # transformers' Qwen3VLVisionConfig defaults
    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: Sequence[int] = (8, 16, 24)
    rope_parameters: dict[str, Any] | None = None

    @property
    def patch_dim(self) -> int:
        """Values in one flattened patch: C * T * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def grid_side(self) -> int:
        return math.isqrt(self.num_position_embeddings)

    @property
    def rope_theta(self) -> float:
        return float((self.rope_parameters or {}).get("rope_theta", 10_000.0))


@dataclass(frozen=True)
class VisionGeometry:
    """What a set of image grids fixes before any weight is read (numpy, computed once per pass)."""
    rows: np.ndarray  # [N] patch row within its image, in merge-block order
    cols: np.ndarray  # [N] patch column
    taps: np.ndarray  # [N, 4] indices into the learned position table (bilinear neighbours)
    tap_weights: np.ndarray  # [N, 4] float32
    segments: list[tuple[int, int]]  # (start, end) patch ranges attending to each other (one frame each)


def vision_geometry(grids: Sequence[Grid], merge: int, side: int) -> VisionGeometry:
    rows, cols, segments, start = [], [], [], 0
    for t, h, w in grids:
        r, c = merge_block_positions(h, w, merge)
        rows.append(np.tile(r, t))
        cols.append(np.tile(c, t))
        for _ in range(t):
            segments.append((start, start + h * w))
            start += h * w
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    heights = np.concatenate([np.full(t * h * w, h) for t, h, w in grids])
    widths = np.concatenate([np.full(t * h * w, w) for t, h, w in grids])
    row_taps, row_weights = _bilinear_taps(rows, heights, side)
    col_taps, col_weights = _bilinear_taps(cols, widths, side)
    taps = (row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(-1, 4)
    weights = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 4).astype(np.float32)
    return VisionGeometry(rows, cols, taps, weights, segments)


def _bilinear_taps(index: np.ndarray, size: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Align-corners linear interpolation of a `side`-long table at `size` evenly spaced points."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.maximum(size - 1, 1).astype(np.float32)
    floor = np.floor(src)
    taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
    weights = np.clip(1 - np.abs(src[:, None] - floor[:, None] - np.arange(2)), 0, None)
    return taps, weights


class PatchEmbed(nn.Module):
    """A Conv3d whose stride equals its kernel is a matmul over flattened patches."""

    def __init__(self, args: VisionArgs):
        super().__init__()
        self.proj = nn.Linear(args.patch_dim, args.hidden_size)

    def __call__(self, patches: mx.array) -> mx.array:
        return self.proj(patches)


class VisionAttention(nn.Module):
    # queries per chunk are bounded so one image's scores never exceed this many values at once
    max_scores = 1 << 25

    def __init__(self, args: VisionArgs):
        super().__init__()
        self.n_heads = args.num_heads
        self.qkv = nn.Linear(args.hidden_size, 3 * args.hidden_size)
        self.proj = nn.Linear(args.hidden_size, args.hidden_size)

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array, segments: list[tuple[int, int]]) -> mx.array:
        n, d = x.shape
        qkv = self.qkv(x).reshape(n, 3, self.n_heads, d // self.n_heads)
        q = rotate(qkv[:, 0], cos, sin).transpose(1, 0, 2) * (1.0 / math.sqrt(d // self.n_heads))
        k = rotate(qkv[:, 1], cos, sin).transpose(1, 0, 2)
        v = qkv[:, 2].transpose(1, 0, 2)
        outs = []
        for start, end in segments:  # each frame attends within itself only
            keys, values = k[:, start:end], v[:, start:end]
            step = max(1, self.max_scores // (self.n_heads * (end - start)))
            for lo in range(start, end, step):
                scores = q[:, lo:min(lo + step, end)] @ keys.swapaxes(-1, -2)
                outs.append(softmax(scores) @ values)
        out = mx.concatenate(outs, axis=1) if len(outs) > 1 else outs[0]
        return self.proj(out.transpose(1, 0, 2).reshape(n, d))


class VisionMLP(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.linear_fc1 = nn.Linear(args.hidden_size, args.intermediate_size)
        self.linear_fc2 = nn.Linear(args.intermediate_size, args.hidden_size)
        self.act = activation(args.hidden_act)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.norm1 = LayerNorm(args.hidden_size, eps=1e-6)
        self.norm2 = LayerNorm(args.hidden_size, eps=1e-6)
        self.attn = VisionAttention(args)
        self.mlp = VisionMLP(args)

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array, segments: list[tuple[int, int]]) -> mx.array:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Four neighbouring patches -> one decoder-width token. The final merger normalizes each patch before
    concatenating; the DeepStack mergers normalize the concatenation."""

    def __init__(self, args: VisionArgs, norm_after_concat: bool):
        super().__init__()
        self.width = args.hidden_size * args.spatial_merge_size ** 2
        self.norm_after_concat = norm_after_concat
        self.norm = LayerNorm(self.width if norm_after_concat else args.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.width, self.width)
        self.linear_fc2 = nn.Linear(self.width, args.out_hidden_size)
        self.act = activation("gelu")  # nn.GELU() in the reference: the erf form

    def __call__(self, x: mx.array) -> mx.array:
        x = self.norm(x.reshape(-1, self.width)) if self.norm_after_concat else self.norm(x).reshape(-1, self.width)
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionModel(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.args = args
        self.patch_embed = PatchEmbed(args)
        self.pos_embed = nn.Embedding(args.num_position_embeddings, args.hidden_size)
        self.blocks = [VisionBlock(args) for _ in range(args.depth)]
        self.merger = PatchMerger(args, norm_after_concat=False)
        self.deepstack_merger_list = [PatchMerger(args, norm_after_concat=True)
                                      for _ in args.deepstack_visual_indexes]

    def rotary(self, geometry: VisionGeometry) -> tuple[mx.array, mx.array]:
        """cos and sin [N, 1, Dh]: the first half of each head's frequencies turn with the row, the rest with
        the column (one frequency table of Dh / 4 entries shared by both axes)."""
        cos, sin = axial_rotary(geometry.rows, geometry.cols, self.args.hidden_size // self.args.num_heads,
                                self.args.rope_theta)
        return cos[:, None], sin[:, None]

    def __call__(self, patches: mx.array, grids: Sequence[Grid]) -> tuple[mx.array, list[mx.array]]:
        """Flattened patches [N, C*T*P*P] of these images -> merged tokens [N / merge^2, D_text] and the
        DeepStack features (one array of that shape per entry of deepstack_visual_indexes)."""
        geometry = vision_geometry(grids, self.args.spatial_merge_size, self.args.grid_side)
        if patches.shape != (len(geometry.rows), self.args.patch_dim):
            raise ValueError(f"pixel values {tuple(patches.shape)} do not match the grids {list(grids)} "
                             f"({len(geometry.rows)} patches of {self.args.patch_dim} values)")
        x = self.patch_embed(patches.astype(self.patch_embed.proj.weight.dtype))
        weights = mx.array(geometry.tap_weights).astype(x.dtype)
        x = x + (self.pos_embed(mx.array(geometry.taps)) * weights[..., None]).sum(axis=1)
        cos, sin = (t.astype(x.dtype) for t in self.rotary(geometry))
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, geometry.segments)
            if i in self.args.deepstack_visual_indexes:
                deepstack.append(self.deepstack_merger_list[list(self.args.deepstack_visual_indexes).index(i)](x))
        return self.merger(x), deepstack
