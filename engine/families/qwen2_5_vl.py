"""Qwen2.5-VL (Qwen2_5_VLModel): a windowed vision transformer whose merged patches replace the <|image_pad|>
tokens of a Qwen2 decoder driven with multimodal rotary positions (M-RoPE).

Vision tower: the flattened patches (engine/images_qwen.py) go through the patch embedding (a Conv3d whose
kernel equals its stride, so a matmul), blocks of RMSNorm + attention with a 2-D rotary (row and column of each
patch) + SwiGLU MLP, then the merger (RMSNorm, each merge_size x merge_size block of patches concatenated, a GELU
MLP) into one decoder-width vector per block. Most blocks attend within windows of window_size pixels; the blocks
listed in fullatt_block_indexes attend over the whole image. One image per call.

Decoder: the Qwen2 blocks, each rotary frequency band reading one of three position axes (mrope_section): text
tokens advance all three together, an image's tokens take (t, row, column) offsets from where the image starts,
and the text after an image resumes at that start plus the image's larger side in blocks (qwen3_vl.rope_index:
the positions are Qwen2-VL's; Qwen3-VL differs only in how the bands are assigned).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.errors import InvalidInput, UnsupportedCheckpoint
from engine.families import llama, qwen2
from engine.families.base import BaseModelArgs, attention, gelu_erf, rotate, split_heads


@dataclass
class VisionArgs(BaseModelArgs):
    # transformers' Qwen2_5_VLVisionConfig defaults
    depth: int = 32
    hidden_size: int = 3584
    hidden_act: str = "silu"
    intermediate_size: int = 3420
    num_heads: int = 16
    in_channels: int = 3
    in_chans: int | None = None  # older exports' name for in_channels
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    window_size: int = 112
    out_hidden_size: int = 3584
    fullatt_block_indexes: list[int] = field(default_factory=lambda: [7, 15, 23, 31])
    rope_parameters: dict[str, Any] | None = None
    rope_theta: float = field(init=False)

    def __post_init__(self):
        self.in_channels = self.in_chans or self.in_channels
        rope = self.rope_parameters or {}
        if rope.get("rope_type", "axial") not in ("axial", "default"):
            raise UnsupportedCheckpoint(f"qwen2_5_vl vision rope type {rope['rope_type']!r} is not supported "
                                        "(supported: axial)")
        self.rope_theta = float(rope.get("rope_theta", 10_000.0))
        if self.window_size % (self.spatial_merge_size * self.patch_size):
            raise UnsupportedCheckpoint(f"qwen2_5_vl vision window_size {self.window_size} is not a multiple of "
                                        f"spatial_merge_size * patch_size")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_bias(self) -> bool:
        return True

    @property
    def window_blocks(self) -> int:
        """A window's side in merged blocks."""
        return self.window_size // self.spatial_merge_size // self.patch_size


def text_args(config: dict[str, Any]) -> tuple[qwen2.ModelArgs, list[int]]:
    """The decoder's args (text_config, or the top level of older exports) and its mrope_section."""
    text = dict(config.get("text_config") or config)
    rope = {**(text.get("rope_scaling") or {}), **(text.get("rope_parameters") or {})}
    section = [int(s) for s in rope.pop("mrope_section", [16, 24, 24])]
    if rope.get("rope_type", rope.get("type")) == "mrope":  # older exports name the scheme, not a scaling
        rope.pop("type", None)
        rope["rope_type"] = "default"
    text.update(rope_parameters=rope, rope_scaling=None)
    text.setdefault("rope_theta", 1_000_000.0)
    args = qwen2.ModelArgs.from_dict(text)
    if len(section) != 3 or sum(section) * 2 != args.head_dim:
        raise UnsupportedCheckpoint(f"qwen2_5_vl mrope_section {section} does not split head_dim {args.head_dim} "
                                    "into three bands (its sum must be head_dim / 2)")
    return args, section


# -- vision tower --------------------------------------------------------------------------------------------

class PatchEmbed(nn.Module):
    """Conv3d(kernel = stride = (T, P, P)) on a flattened patch row is a matmul with the flattened filter."""

    def __init__(self, args: VisionArgs):
        super().__init__()
        self.proj = nn.Module()
        self.proj.weight = mx.zeros((args.hidden_size, args.in_channels, args.temporal_patch_size,
                                     args.patch_size, args.patch_size))

    def __call__(self, patches: mx.array) -> mx.array:
        weight = self.proj.weight
        return patches @ weight.reshape(weight.shape[0], -1).T


class VisionAttention(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.n_heads = args.num_heads
        self.qkv = nn.Linear(args.hidden_size, 3 * args.hidden_size)
        self.proj = nn.Linear(args.hidden_size, args.hidden_size)

    def __call__(self, x: mx.array, mask: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        """x [G, N, D]: G groups (windows, or the whole image) of N patches, attending within each group."""
        q, k, v = (split_heads(t, self.n_heads) for t in mx.split(self.qkv(x), 3, axis=-1))
        # rotated in float32 (cos and sin are), then back to the compute dtype, as the reference does
        q, k = (rotate(t, cos, sin).astype(x.dtype) for t in (q, k))
        return self.proj(attention(q, k, v, mask))


class VisionBlock(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.norm1 = nn.RMSNorm(args.hidden_size, eps=1e-6)
        self.norm2 = nn.RMSNorm(args.hidden_size, eps=1e-6)
        self.attn = VisionAttention(args)
        self.mlp = llama.MLP(args)  # gated, with biases here

    def __call__(self, x: mx.array, mask: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        h = x + self.attn(self.norm1(x), mask, cos, sin)
        return h + self.mlp(self.norm2(h))


class Gelu(nn.Module):
    """The merger's exact (erf) GELU, as a parameterless layer so the MLP list keeps the checkpoint's indices."""

    def __call__(self, x: mx.array) -> mx.array:
        return gelu_erf(x)


class PatchMerger(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        width = args.hidden_size * args.spatial_merge_size ** 2
        self.ln_q = nn.RMSNorm(args.hidden_size, eps=1e-6)
        self.mlp = [nn.Linear(width, width), Gelu(), nn.Linear(width, args.out_hidden_size)]

    def __call__(self, x: mx.array) -> mx.array:
        """[n_patches, D], each block's patches consecutive -> [n_patches / merge^2, out_hidden_size]."""
        x = self.ln_q(x)
        x = x.reshape(-1, self.mlp[0].weight.shape[1])
        for layer in self.mlp:
            x = layer(x)
        return x


@dataclass(frozen=True)
class WindowLayout:
    """Where each patch sits when the image is cut into windows, padded to one window size: patch i is at
    flat slot slots[i] of a [n_windows, size] grid; filled marks the slots that hold a patch."""
    slots: np.ndarray
    filled: np.ndarray
    n_windows: int
    size: int


def window_layout(grid_h: int, grid_w: int, args: VisionArgs) -> WindowLayout:
    """Windows of window_blocks x window_blocks merged blocks, counted from the top-left corner (the last row
    and column of windows may be partial), patches in their processor order within a window."""
    m, side = args.spatial_merge_size, args.window_blocks
    blocks_h, blocks_w = grid_h // m, grid_w // m
    rows, cols = np.divmod(np.arange(blocks_h * blocks_w), blocks_w)  # each block's place, in processor order
    windows_w = -(-blocks_w // side)
    window = (rows // side) * windows_w + cols // side
    order = np.argsort(window, kind="stable")  # blocks window by window, processor order inside each
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    counts = np.bincount(window, minlength=window.max() + 1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    block_slot = window * side * side + (rank - starts[window])  # block's place in the padded window grid
    size, n_windows = side * side * m * m, int(window.max()) + 1
    slots = (block_slot[:, None] * m * m + np.arange(m * m)[None]).reshape(-1)
    filled = np.zeros(n_windows * size, dtype=bool)
    filled[slots] = True
    return WindowLayout(slots=slots, filled=filled.reshape(n_windows, size), n_windows=n_windows, size=size)


def vision_positions(grid_h: int, grid_w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of every patch, in the processor's block-major order."""
    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    shape = (grid_h // merge, merge, grid_w // merge, merge)
    return (rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1),
            cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1))


class VisionModel(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.args = args
        self.patch_embed = PatchEmbed(args)
        self.blocks = [VisionBlock(args) for _ in range(args.depth)]
        self.merger = PatchMerger(args)

    def rotary(self, grid_h: int, grid_w: int) -> tuple[mx.array, mx.array]:
        """cos, sin [n_patches, head_dim]: the first half of each head's bands turns with the row, the second
        with the column (both with the same frequencies), in the rotate-half layout."""
        spatial = self.args.head_dim // 2
        inv_freq = 1.0 / (self.args.rope_theta ** (np.arange(0, spatial, 2, dtype=np.float32) / spatial))
        rows, cols = vision_positions(grid_h, grid_w, self.args.spatial_merge_size)
        angles = np.concatenate([rows[:, None] * inv_freq, cols[:, None] * inv_freq], axis=-1).astype(np.float32)
        angles = mx.array(np.concatenate([angles, angles], axis=-1))
        return mx.cos(angles), mx.sin(angles)

    def __call__(self, patches: mx.array, grid_thw: tuple[int, int, int]) -> mx.array:
        """One image's flattened patches [n_patches, C*T*P*P] -> merged features [n_tokens, out_hidden_size]."""
        t, grid_h, grid_w = grid_thw
        if t != 1:
            raise InvalidInput("qwen2_5_vl embeds still images only (temporal grid 1)")
        n = grid_h * grid_w
        x = self.patch_embed(patches.astype(self.patch_embed.proj.weight.dtype))
        cos, sin = self.rotary(grid_h, grid_w)
        layout = window_layout(grid_h, grid_w, self.args)
        slots = mx.array(layout.slots)
        # patch i at padded slot slots[i]; gathering through `source` builds the windows, empty slots read patch 0
        source = np.zeros(layout.n_windows * layout.size, dtype=np.int32)
        source[layout.slots] = np.arange(n, dtype=np.int32)
        source = mx.array(source)
        window_mask = mx.array(layout.filled)[:, None, None, :]
        full_mask = mx.ones((1, 1, 1, n), dtype=mx.bool_)

        def windowed(a: mx.array) -> mx.array:
            return a[source].reshape(layout.n_windows, layout.size, -1)

        win_cos, win_sin = windowed(cos)[:, None], windowed(sin)[:, None]
        full = set(self.args.fullatt_block_indexes)
        for index, block in enumerate(self.blocks):
            if index in full:
                x = block(x[None], full_mask, cos[None, None], sin[None, None])[0]
            else:
                x = block(windowed(x), window_mask, win_cos, win_sin).reshape(-1, x.shape[-1])[slots]
        return self.merger(x)


# -- decoder with M-RoPE -------------------------------------------------------------------------------------

def mrope_tables(positions: mx.array, head_dim: int, theta: float, section: list[int]) -> tuple[mx.array, mx.array]:
    """positions [3, B, L] -> cos, sin [B, 1, L, head_dim]: frequency band j reads axis (section index of j) % 3."""
    inv_freq = 1.0 / (theta ** (mx.arange(0, head_dim, 2).astype(mx.float32) / head_dim))
    axis = np.concatenate([np.full(size, i % 3) for i, size in enumerate(section)])
    chosen = positions.transpose(1, 2, 0)[..., mx.array(axis)]  # [B, L, head_dim / 2]
    angles = chosen.astype(mx.float32) * inv_freq
    angles = mx.concatenate([angles, angles], axis=-1)[:, None]
    return mx.cos(angles), mx.sin(angles)


class TextModel(llama.DecoderModel):
    """The Qwen2 decoder fed embeddings (image features already in place) and M-RoPE positions."""

    def __init__(self, args: qwen2.ModelArgs, section: list[int]):
        super().__init__(args)
        self.mrope_section = section

    def run(self, x: mx.array, attention_mask: mx.array, positions: mx.array) -> mx.array:
        args = self.args
        kinds = set(args.layer_types)
        cos, sin = (t.astype(x.dtype) for t in mrope_tables(positions, args.head_dim, args.rope["rope_theta"],
                                                           self.mrope_section))
        masks = self.layer_masks(attention_mask, kinds)
        for layer in self.layers:
            x = layer(x, masks[layer.layer_type], cos, sin)
        return self.norm(x)
