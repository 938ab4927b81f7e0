"""The Qwen-VL rotary positions, shared by Qwen2-VL / Qwen2.5-VL (engine/families/qwen2_vl.py, qwen2_5_vl.py,
under ColQwen2) and Qwen3-VL (engine/families/qwen3_vl.py, qwen3_vl_tower.py). Not a family: no model_type is
served by this file.

Decoder (M-RoPE): every token has three positions, temporal, height and width ([3, B, L], rope_index: text
tokens advance all three together, an image's tokens take (t, row, column) offsets from where the image starts,
and the text after it resumes at that start plus the image's larger side in merged blocks). Each rotary
frequency reads one of the three axes: Qwen2-VL assigns them in contiguous bands (sectioned_axes), Qwen3-VL
interleaves them (interleaved_axes); mrope_tables turns positions and that assignment into cos / sin.

Vision towers (axial rotary): a patch turns the first half of each head's frequencies with its row and the
second half with its column (axial_rotary), the patches listed in the processor's merge-block order
(merge_block_positions).
"""
from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np

Grid = tuple[int, int, int]  # (t, h, w) in patches, as image_grid_thw


# -- decoder: M-RoPE -----------------------------------------------------------------------------------------

def rope_index(input_ids: np.ndarray, attention_mask: np.ndarray, grids: Sequence[Grid], image_token_id: int,
               merge: int) -> np.ndarray:
    """Multimodal rotary positions [3, B, L] (temporal, height, width), as transformers' get_rope_index.

    Real tokens are numbered from 0 in each row; each run of image tokens takes the next grid (in row-major
    order over the batch) and lays it out from the running position; text resumes at that position plus the
    grid's larger merged side. Without grids every token is text (as the reference without pixel values).
    Padding gets 0.
    """
    batch, length = input_ids.shape
    positions = np.zeros((3, batch, length), dtype=np.int32)
    images = iter(grids)
    for b in range(batch):
        real = np.flatnonzero(attention_mask[b] != 0)
        is_image = (input_ids[b, real] == image_token_id) if grids else np.zeros(len(real), dtype=bool)
        edges = np.flatnonzero(np.diff(is_image.astype(np.int8))) + 1
        row, current = [], 0
        for start, end in zip([0, *edges], [*edges, len(real)]):  # runs of text and of image tokens
            if end == start:
                continue
            if not is_image[start]:
                row.append(np.broadcast_to(np.arange(current, current + end - start), (3, end - start)))
                current += end - start
                continue
            try:
                t, h, w = next(images)
            except StopIteration:
                raise ValueError("more runs of image tokens than images") from None
            gh, gw = h // merge, w // merge
            if end - start != t * gh * gw:
                raise ValueError(f"a run of {end - start} image tokens for an image of {t * gh * gw} tokens")
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
            row.append(np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + current)
            current += max(gh, gw)
        if row:
            positions[:, b, real] = np.concatenate(row, axis=1)
    if next(images, None) is not None:
        raise ValueError("more images than runs of image tokens")
    return positions


def sectioned_axes(section: Sequence[int]) -> np.ndarray:
    """Qwen2-VL's M-RoPE: which position axis (0 t, 1 h, 2 w) each frequency reads, in contiguous bands of
    section[0], section[1], section[2] frequencies."""
    return np.concatenate([np.full(size, i % 3) for i, size in enumerate(section)])


def interleaved_axes(n_freq: int, section: Sequence[int]) -> np.ndarray:
    """Qwen3-VL's interleaved M-RoPE: frequency i turns with the height position when i % 3 == 1 and
    i < 3 * section[1], the width when i % 3 == 2 and i < 3 * section[2], else with the temporal one."""
    i = np.arange(n_freq)
    axis = np.zeros_like(i)
    axis[(i % 3 == 1) & (i < 3 * section[1])] = 1
    axis[(i % 3 == 2) & (i < 3 * section[2])] = 2
    return axis


def mrope_tables(positions: mx.array, inv_freq: mx.array, axis: np.ndarray) -> tuple[mx.array, mx.array]:
    """positions [3, B, L] -> cos, sin [B, 1, L, head_dim], frequency i turning with position axis axis[i]."""
    chosen = positions.transpose(1, 2, 0)[..., mx.array(axis)]  # [B, L, head_dim / 2]
    angles = chosen.astype(mx.float32) * inv_freq
    angles = mx.concatenate([angles, angles], axis=-1)[:, None]
    return mx.cos(angles), mx.sin(angles)


# -- vision towers: axial rotary -----------------------------------------------------------------------------

def merge_block_positions(grid_h: int, grid_w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column [grid_h * grid_w] of each patch of one frame in the processor's merge-block order: merge x
    merge blocks in row-major order, the patches of a block consecutive (row-major inside it)."""
    rows = np.arange(grid_h).reshape(grid_h // merge, 1, merge, 1)
    cols = np.arange(grid_w).reshape(1, grid_w // merge, 1, merge)
    rows, cols = np.broadcast_arrays(rows, cols)  # (block row, block column, row in block, column in block)
    return rows.ravel(), cols.ravel()


def axial_rotary(rows: np.ndarray, cols: np.ndarray, head_dim: int, theta: float) -> tuple[mx.array, mx.array]:
    """cos, sin [N, head_dim] of the Qwen-VL towers' 2-D rotary for patches at (rows, cols): one table of
    head_dim / 4 frequencies, turned by the row in the first half of the bands and by the column in the second."""
    spatial = head_dim // 2
    inv_freq = 1.0 / (theta ** (np.arange(0, spatial, 2, dtype=np.float32) / spatial))
    angles = np.concatenate([rows[:, None] * inv_freq, cols[:, None] * inv_freq], axis=-1).astype(np.float32)
    angles = mx.array(np.concatenate([angles, angles], axis=-1))
    return mx.cos(angles), mx.sin(angles)
