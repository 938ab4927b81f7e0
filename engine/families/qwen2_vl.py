"""Qwen2-VL (Qwen2VLModel): a vision transformer whose merged patches replace the <|image_pad|> tokens of a Qwen2
decoder driven with multimodal rotary positions (M-RoPE). Qwen2.5-VL (engine/families/qwen2_5_vl.py) reuses the
pieces defined here and changes the tower's blocks.

Vision tower: the flattened patches (engine/multimodal/qwen_images.py) go through the patch embedding (a Conv3d whose
kernel equals its stride, so a matmul), blocks of LayerNorm + attention over the whole image with a 2-D rotary
(row and column of each patch) + a GELU MLP (fc1, fc2), then the merger (LayerNorm, each merge_size x merge_size
block of patches concatenated, a GELU MLP) into one decoder-width vector per block. One image per call.

Decoder: the Qwen2 blocks, each rotary frequency band reading one of three position axes (mrope_section): text
tokens advance all three together, an image's tokens take (t, row, column) offsets from where the image starts,
and the text after an image resumes at that start plus the image's larger side in blocks (engine/families/mrope.py,
shared with Qwen3-VL, which differs only in how the bands are assigned).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.errors import InvalidInput, UnsupportedCheckpoint
from engine.families import llama, qwen2
from engine.families.base import (
    BaseModelArgs,
    GeluErf,
    LayerNorm,
    Rotary,
    activation,
    attention,
    rope_inverse_frequencies,
    rotate,
    split_heads,
)
from engine.families.mrope import axial_rotary, merge_block_positions, mrope_tables, sectioned_axes


@dataclass
class VisionArgs(BaseModelArgs):
    # transformers' Qwen2VLVisionConfig defaults
    depth: int = 32
    embed_dim: int = 1280
    hidden_size: int = 3584  # the decoder's width, what the merger outputs
    hidden_act: str = "quick_gelu"
    mlp_ratio: float = 4
    num_heads: int = 16
    in_channels: int = 3
    in_chans: int | None = None  # older exports' name for in_channels
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    rope_parameters: dict[str, Any] | None = None
    rope_theta: float = field(init=False)

    family = "qwen2_vl"

    def __post_init__(self):
        self.in_channels = self.in_chans or self.in_channels
        rope = self.rope_parameters or {}
        if rope.get("rope_type", "axial") not in ("axial", "default"):
            raise UnsupportedCheckpoint(f"{self.family} vision rope type {rope['rope_type']!r} is not supported "
                                        "(supported: axial)")
        self.rope_theta = float(rope.get("rope_theta", 10_000.0))

    @property
    def width(self) -> int:
        return self.embed_dim

    @property
    def out_width(self) -> int:
        return self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads


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
        raise UnsupportedCheckpoint(f"{config.get('model_type')} mrope_section {section} does not split head_dim "
                                    f"{args.head_dim} into three bands (its sum must be head_dim / 2)")
    return args, section


# -- vision tower pieces (shared with Qwen2.5-VL) ------------------------------------------------------------

class PatchEmbed(nn.Module):
    """Conv3d(kernel = stride = (T, P, P)) on a flattened patch row is a matmul with the flattened filter."""

    def __init__(self, args: VisionArgs):
        super().__init__()
        self.proj = nn.Module()
        self.proj.weight = mx.zeros((args.width, args.in_channels, args.temporal_patch_size,
                                     args.patch_size, args.patch_size))

    def __call__(self, patches: mx.array) -> mx.array:
        weight = self.proj.weight
        return patches.astype(weight.dtype) @ weight.reshape(weight.shape[0], -1).T


class VisionAttention(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.n_heads = args.num_heads
        self.qkv = nn.Linear(args.width, 3 * args.width)
        self.proj = nn.Linear(args.width, args.width)

    def __call__(self, x: mx.array, mask: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        """x [G, N, D]: G groups (windows, or the whole image) of N patches, attending within each group."""
        q, k, v = (split_heads(t, self.n_heads) for t in mx.split(self.qkv(x), 3, axis=-1))
        # rotated in float32 (cos and sin are), then back to the compute dtype, as the reference does
        q, k = (rotate(t, cos, sin).astype(x.dtype) for t in (q, k))
        return self.proj(attention(q, k, v, mask))


class PatchMerger(nn.Module):
    def __init__(self, args: VisionArgs, norm: type[nn.Module] = LayerNorm):
        super().__init__()
        width = args.width * args.spatial_merge_size ** 2
        self.ln_q = norm(args.width, eps=1e-6)
        self.mlp = [nn.Linear(width, width), GeluErf(), nn.Linear(width, args.out_width)]

    def __call__(self, x: mx.array) -> mx.array:
        """[n_patches, D], each block's patches consecutive -> [n_patches / merge^2, out_width]."""
        x = self.ln_q(x)
        x = x.reshape(-1, self.mlp[0].weight.shape[1])
        for layer in self.mlp:
            x = layer(x)
        return x


def vision_rotary(grid_h: int, grid_w: int, args: VisionArgs) -> tuple[mx.array, mx.array]:
    """cos, sin [n_patches, head_dim] in the processor's block-major patch order: the first half of each head's
    bands turns with the patch's row, the second with its column (same frequencies), rotate-half layout."""
    rows, cols = merge_block_positions(grid_h, grid_w, args.spatial_merge_size)
    return axial_rotary(rows, cols, args.head_dim, args.rope_theta)


def still_image(grid_thw: tuple[int, int, int]) -> tuple[int, int]:
    t, grid_h, grid_w = grid_thw
    if t != 1:
        raise InvalidInput("Qwen-VL retrievers embed still images only (temporal grid 1)")
    return grid_h, grid_w


# -- Qwen2-VL's tower ----------------------------------------------------------------------------------------

class VisionMLP(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        hidden = int(args.width * args.mlp_ratio)
        self.fc1 = nn.Linear(args.width, hidden)
        self.fc2 = nn.Linear(hidden, args.width)
        self.act = activation(args.hidden_act)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc2(self.act(self.fc1(x)))


class VisionBlock(nn.Module):
    norm: type[nn.Module] = LayerNorm
    mlp_class: type[nn.Module] = VisionMLP

    def __init__(self, args: VisionArgs):
        super().__init__()
        self.norm1 = self.norm(args.width, eps=1e-6)
        self.norm2 = self.norm(args.width, eps=1e-6)
        self.attn = VisionAttention(args)
        self.mlp = self.mlp_class(args)

    def __call__(self, x: mx.array, mask: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        h = x + self.attn(self.norm1(x), mask, cos, sin)
        return h + self.mlp(self.norm2(h))


class VisionModel(nn.Module):
    block: type[nn.Module] = VisionBlock

    def __init__(self, args: VisionArgs):
        super().__init__()
        self.args = args
        self.patch_embed = PatchEmbed(args)
        self.blocks = [self.block(args) for _ in range(args.depth)]
        self.merger = PatchMerger(args, self.block.norm)

    def __call__(self, patches: mx.array, grid_thw: tuple[int, int, int]) -> mx.array:
        """One image's flattened patches [n_patches, C*T*P*P] -> merged features [n_tokens, out_width]."""
        grid_h, grid_w = still_image(grid_thw)
        x = self.patch_embed(patches)[None]
        cos, sin = (t[None, None] for t in vision_rotary(grid_h, grid_w, self.args))
        mask = mx.ones((1, 1, 1, x.shape[1]), dtype=mx.bool_)
        for block in self.blocks:
            x = block(x, mask, cos, sin)
        return self.merger(x[0])


# -- decoder with M-RoPE -------------------------------------------------------------------------------------

class TextModel(llama.DecoderModel):
    """The Qwen2 decoder fed embeddings (image features already in place) and M-RoPE positions."""

    def __init__(self, args: qwen2.ModelArgs, section: list[int]):
        super().__init__(args)
        self.mrope_section = section

    def run(self, x: mx.array, attention_mask: mx.array, positions: mx.array) -> mx.array:
        args = self.args
        kinds = set(args.layer_types)
        inv_freq = rope_inverse_frequencies(args.head_dim, args.rope)
        rope = Rotary.from_tables(*(t.astype(x.dtype) for t in mrope_tables(positions, inv_freq,
                                                                            sectioned_axes(self.mrope_section))))
        masks = self.layer_masks(attention_mask, kinds)
        for layer in self.layers:
            x = layer(x, masks[layer.layer_type], rope)
        return self.norm(x)
