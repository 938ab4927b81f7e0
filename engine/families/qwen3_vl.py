"""Qwen3-VL (Qwen3VLForConditionalGeneration / Qwen3VLModel): a ViT over 16 px patches feeding the Qwen3 decoder.

The vision tower embeds flattened (C, T, P, P) patches with one matmul, adds learned positions resampled
bilinearly (align-corners) from a square table to the image's grid, and runs pre-norm LayerNorm blocks with
2-D rotary attention (height angles then width angles) inside each image. Patches arrive in 2x2 merge-block
order, so the merger simply concatenates four neighbours: LayerNorm -> Linear -> GELU -> Linear into the
decoder's width. DeepStack: after the blocks listed in `deepstack_visual_indexes` the hidden states go through
their own merger, and those features are ADDED to the image tokens' hidden states after decoder layers 0, 1, ...

The decoder is Qwen3's, with interleaved M-RoPE (engine/families/mrope.py): each rotary frequency reads the
temporal, height or width position of the token (text tokens have all three equal). Positions follow
transformers' get_rope_index: an image's run of <|image_pad|> tokens takes a (t, h, w) grid starting at the
running position, the text after it continues from the largest position used plus one.

Used as an embedder (Qwen3-VL-Embedding): final normed hidden states, the LM head never loaded. `CausalLM`
keeps the head for yes/no rerankers (Qwen3-VL-Reranker), which read only two of its rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.families import llama, qwen3
from engine.families.base import (
    BaseModelArgs,
    Trunk,
    activation,
    place_image_features,
    rope_inverse_frequencies,
    rotate,
    softmax,
)
from engine.families.mrope import Grid, axial_rotary, interleaved_axes, merge_block_positions, mrope_tables, rope_index


@dataclass
class TextArgs(qwen3.ModelArgs):
    default_rope_theta = 500_000.0
    mrope_section: list[int] = field(init=False)

    def __post_init__(self):
        super().__post_init__()
        section = self.rope.get("mrope_section") or [24, 20, 20]
        if len(section) != 3 or sum(section) != self.head_dim // 2:
            raise UnsupportedCheckpoint(f"{self.family}: mrope_section {section} does not split "
                                        f"{self.head_dim // 2} rotary frequencies into (t, h, w)")
        if self.rope.get("mrope_interleaved") is False:  # transformers' Qwen3-VL always interleaves
            raise UnsupportedCheckpoint(f"{self.family}: mrope_interleaved false is not supported")
        self.mrope_section = list(section)


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


@dataclass
class ModelArgs(BaseModelArgs):
    text_config: dict[str, Any]
    vision_config: dict[str, Any]
    model_type: str = "qwen3_vl"
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    tie_word_embeddings: bool = False
    text: TextArgs = field(init=False)
    vision: VisionArgs = field(init=False)

    def __post_init__(self):
        self.text = TextArgs.from_dict({"model_type": "qwen3_vl_text", **self.text_config})
        self.vision = VisionArgs.from_dict(self.vision_config)
        self.tie_word_embeddings = bool(self.text_config.get("tie_word_embeddings", self.tie_word_embeddings))
        if self.vision.out_hidden_size != self.text.hidden_size:
            raise UnsupportedCheckpoint(f"qwen3_vl: the vision tower's output width {self.vision.out_hidden_size} "
                                        f"is not the decoder's width {self.text.hidden_size}")
        if self.vision.grid_side ** 2 != self.vision.num_position_embeddings:
            raise UnsupportedCheckpoint(f"qwen3_vl: num_position_embeddings {self.vision.num_position_embeddings} "
                                        "is not a square grid")


# -- vision tower --------------------------------------------------------------------------------------------

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
        self.norm1 = nn.LayerNorm(args.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(args.hidden_size, eps=1e-6)
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
        self.norm = nn.LayerNorm(self.width if norm_after_concat else args.hidden_size, eps=1e-6)
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


# -- decoder with M-RoPE and DeepStack -----------------------------------------------------------------------

class TextModel(llama.DecoderModel):
    """The Qwen3 decoder (embed_tokens, layers, norm) driven by embeddings, 3-D positions and DeepStack."""

    def __call__(self, embeds: mx.array, attention_mask: mx.array, positions: mx.array,
                 deepstack: Sequence[mx.array] = ()) -> mx.array:
        """embeds [B, L, D], mask [B, L], positions [3, B, L]; deepstack[i] [B, L, D] is added after layer i
        (zero outside image tokens). Returns the final normed hidden states."""
        args = self.args
        inv_freq = rope_inverse_frequencies(args.head_dim, args.rope)
        axis = interleaved_axes(inv_freq.shape[0], args.mrope_section)
        cos, sin = (t.astype(embeds.dtype) for t in mrope_tables(positions, inv_freq, axis))
        mask = self.layer_masks(attention_mask, {llama.FULL})[llama.FULL]
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, cos, sin)
            if i < len(deepstack):
                x = x + deepstack[i]
        return self.norm(x)


class Qwen3VLModel(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.visual = VisionModel(args.vision)
        self.language_model = TextModel(args.text)


class Model(Trunk):
    """Token ids (with runs of <|image_pad|>) and their images' patches -> final normed hidden states."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Qwen3VLModel(args)

    @property
    def hidden_size(self) -> int:
        return self.args.text.hidden_size

    @property
    def n_positions(self) -> int:
        return self.args.text.max_position_embeddings

    @property
    def image_token_id(self) -> int:
        return self.args.image_token_id

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.forward(input_ids, attention_mask)

    def forward(self, input_ids: mx.array, attention_mask: mx.array, patches: mx.array | None = None,
                grids: Sequence[Grid] = (), positions: mx.array | None = None) -> mx.array:
        """ids and mask [B, L] (right or left padded); patches [N, C*T*P*P] of the images whose runs of
        image tokens appear in the rows, in row-major order, with their (t, h, w) grids. positions [3, B, L]:
        rotary positions to use instead of rope_index's (mask-aware) ones."""
        ids_np, mask_np = np.array(input_ids), np.array(attention_mask)
        if positions is None:
            positions = mx.array(rope_index(ids_np, mask_np, grids, self.args.image_token_id,
                                            self.args.vision.spatial_merge_size))
        embeds = self.model.language_model.embed(input_ids)
        deepstack: list[mx.array] = []
        if grids:
            features, stacked = self.model.visual(patches, grids)
            is_image = ids_np == self.args.image_token_id
            embeds = place_image_features(embeds, is_image, features)
            # DeepStack features are added, so zero outside the image tokens
            deepstack = [place_image_features(mx.zeros_like(embeds), is_image, f) for f in stacked]
        return self.model.language_model(embeds, attention_mask, positions, deepstack)

    def embed_with_images(self, input_ids: mx.array, images: list[dict[str, mx.array]]) -> mx.array:
        """One input, ids [1, L] with each image's <|image_pad|> run expanded, and its images' arrays in prompt
        order (pixel_values [N, C*T*P*P], image_grid_thw [3]) -> final normed hidden states [1, L, D]."""
        grids = [tuple(int(v) for v in np.array(image["image_grid_thw"]).reshape(3)) for image in images]
        patches = mx.concatenate([image["pixel_values"] for image in images])
        return self.forward(input_ids, mx.ones(input_ids.shape, dtype=mx.int32), patches, grids)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return checkpoint_weights(weights, self.args.vision, keep_head=False)


class CausalLM(Model):
    """Qwen3-VL with its LM head, kept only to read the rows of the tokens a yes/no reranker compares."""

    def __init__(self, args: ModelArgs):
        super().__init__(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.text.hidden_size, args.text.vocab_size, bias=False)

    def head_rows(self, token_ids: list[int]) -> mx.array:
        """The LM head's rows for these tokens, [len(token_ids), D]."""
        return qwen3.head_rows(self.lm_head if "lm_head" in self else None,
                               self.model.language_model.embed_tokens, token_ids)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return checkpoint_weights(weights, self.args.vision, keep_head=not self.args.tie_word_embeddings)


# checkpoint prefix -> ours, first match wins: transformers >= 4.57 (model.visual / model.language_model),
# a bare Qwen3VLModel (visual / language_model), mlx-vlm (vision_tower / language_model.model), and the
# Qwen2-VL-era layout (visual / model).
_PREFIXES = (("model.visual.", "model.visual."), ("model.language_model.", "model.language_model."),
             ("vision_tower.", "model.visual."), ("language_model.model.", "model.language_model."),
             ("language_model.lm_head.", "lm_head."), ("visual.", "model.visual."),
             ("language_model.", "model.language_model."), ("lm_head.", "lm_head."),
             ("model.", "model.language_model."))


def checkpoint_weights(weights: dict[str, mx.array], vision: VisionArgs, keep_head: bool) -> dict[str, mx.array]:
    """Checkpoint keys -> ours; rotary buffers dropped; the patch filter flattened to a matrix (from torch's
    [out, C, T, P, P] or mlx-vlm's channels-last [out, T, P, P, C]); lm_head kept only when asked."""
    out = {}
    for key, value in weights.items():
        if "rotary_emb." in key or "rotary_pos_emb." in key:
            continue
        for old, new in _PREFIXES:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        else:
            raise UnsupportedCheckpoint(f"qwen3_vl: unexpected weight {key!r}")
        if key.startswith("lm_head.") and not keep_head:
            continue
        if key == "model.visual.patch_embed.proj.weight" and value.ndim == 5:
            if value.shape[1] != vision.in_channels:  # channels-last
                value = value.transpose(0, 4, 1, 2, 3)
            value = value.reshape(value.shape[0], -1)
        out[key] = value
    return out
