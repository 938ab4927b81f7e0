"""Qwen2.5-VL's vision tower: Qwen2-VL's (engine/families/qwen2_vl.py) with RMSNorm, a gated (SwiGLU) MLP with
biases, and windowed attention: most blocks attend within windows of window_size pixels (window_size /
patch_size / merge_size merged blocks a side, counted from the top-left corner, the last row and column of windows
possibly partial); the blocks listed in fullatt_block_indexes attend over the whole image. The merger normalizes
with RMSNorm. The decoder and its M-RoPE positions are Qwen2-VL's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.families import llama, qwen2_vl
from engine.families.qwen2_vl import still_image, vision_rotary


@dataclass
class VisionArgs(qwen2_vl.VisionArgs):
    # transformers' Qwen2_5_VLVisionConfig defaults
    hidden_size: int = 3584  # the tower's width (Qwen2-VL calls it embed_dim)
    hidden_act: str = "silu"
    intermediate_size: int = 3420
    window_size: int = 112
    out_hidden_size: int = 3584
    fullatt_block_indexes: list[int] = field(default_factory=lambda: [7, 15, 23, 31])

    family = "qwen2_5_vl"

    def __post_init__(self):
        super().__post_init__()
        if self.window_size % (self.spatial_merge_size * self.patch_size):
            raise UnsupportedCheckpoint(f"qwen2_5_vl vision window_size {self.window_size} is not a multiple of "
                                        f"spatial_merge_size * patch_size")

    @property
    def width(self) -> int:
        return self.hidden_size

    @property
    def out_width(self) -> int:
        return self.out_hidden_size

    @property
    def mlp_bias(self) -> bool:
        return True

    @property
    def window_blocks(self) -> int:
        """A window's side in merged blocks."""
        return self.window_size // self.spatial_merge_size // self.patch_size


class VisionBlock(qwen2_vl.VisionBlock):
    norm = nn.RMSNorm
    mlp_class = llama.MLP  # gated, with biases here (VisionArgs.mlp_bias)


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


class VisionModel(qwen2_vl.VisionModel):
    block = VisionBlock

    def __call__(self, patches: mx.array, grid_thw: tuple[int, int, int]) -> mx.array:
        """One image's flattened patches [n_patches, C*T*P*P] -> merged features [n_tokens, out_hidden_size]."""
        grid_h, grid_w = still_image(grid_thw)
        n = grid_h * grid_w
        x = self.patch_embed(patches)
        cos, sin = vision_rotary(grid_h, grid_w, self.args)
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
