"""Qwen3-VL (Qwen3VLForConditionalGeneration / Qwen3VLModel): a ViT over 16 px patches feeding the Qwen3 decoder.

The vision tower (engine/families/qwen3_vl_tower.py) turns each image's patches into decoder-width tokens that
replace its run of <|image_pad|> tokens, plus the DeepStack features, which are ADDED to the image tokens'
hidden states after decoder layers 0, 1, ...

The decoder is Qwen3's, with interleaved M-RoPE (engine/families/mrope.py): each rotary frequency reads the
temporal, height or width position of the token (text tokens have all three equal). Positions follow
transformers' get_rope_index: an image's run of <|image_pad|> tokens takes a (t, h, w) grid starting at the
running position, the text after it continues from the largest position used plus one.

Used as an embedder (Qwen3-VL-Embedding): final normed hidden states, the LM head never loaded. `CausalLM`
keeps the head for yes/no rerankers (Qwen3-VL-Reranker), which read only two of its rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.families import llama, qwen3
from engine.families.base import BaseModelArgs, Trunk, place_image_features, rope_inverse_frequencies
from engine.families.mrope import Grid, interleaved_axes, mrope_tables, rope_index
from engine.families.qwen3_vl_tower import VisionArgs, VisionModel


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
