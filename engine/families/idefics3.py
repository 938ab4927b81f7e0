"""ColIdefics3 (model_type idefics3, architecture ColIdefics3): late-interaction retrieval on the Idefics3 /
SmolVLM stack. A multi-vector family (engine/multimodal/inputs.py): every token's final hidden state goes through one
Linear (`linear`, 128 wide) and is L2-normalized on its own; MaxSim compares queries with documents.

The stack under `model.`: a SigLIP vision tower without its pooling head (`vision_model`: patches + positions,
encoder, post-layernorm) over each tile of an image; the connector (`connector`), which pixel-shuffles a tile's
patch grid by `scale_factor` (each scale x scale block of patches becomes one token, its features side by side)
and projects it with one bias-free Linear to the decoder's width; and a Llama decoder (`text_model`, the
checkpoint has no LM head). The tiles' features replace the `<image>` tokens of the prompt, in order, before
the decoder runs. The prompt formats and the image processor are in engine/multimodal/builders/idefics3.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.families import llama, siglip
from engine.families.base import Trunk, l2_normalize, pixel_shuffle, place_image_features

PROJECTION_WIDTH = 128  # ColIdefics3's `linear`: the width of every token vector


@dataclass
class VisionArgs(siglip.VisionArgs):
    # transformers' Idefics3VisionConfig defaults (they differ from SigLIP's own)
    hidden_size: int = 1152
    num_attention_heads: int = 16
    patch_size: int = 32


@dataclass
class ModelArgs:
    text: llama.ModelArgs
    vision: VisionArgs
    scale_factor: int = 2
    image_token_id: int = 128257

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModelArgs:
        if config.get("mask_non_image_embeddings"):
            raise UnsupportedCheckpoint("ColIdefics3 with mask_non_image_embeddings: true (only image tokens kept) "
                                        "is not supported")
        text = config.get("text_config") or {}
        if text.get("model_type", "llama") != "llama":
            raise UnsupportedCheckpoint(f"an Idefics3 decoder of model_type {text.get('model_type')!r} is not "
                                        f"supported (only llama)")
        vision = VisionArgs.from_dict(config.get("vision_config") or {})
        scale = int(config.get("scale_factor", 2))
        side = vision.image_size // vision.patch_size
        if vision.image_size % vision.patch_size or side % scale:
            raise UnsupportedCheckpoint(f"Idefics3: a {vision.image_size}-pixel tile of {vision.patch_size}-pixel "
                                        f"patches cannot be pixel-shuffled by {scale}")
        return cls(text=llama.ModelArgs.from_dict({"model_type": "llama", **text}), vision=vision,
                   scale_factor=scale, image_token_id=int(config.get("image_token_id", 128257)))

    @property
    def tokens_per_tile(self) -> int:
        """Image tokens one tile becomes: its patches over scale_factor^2 (the processor's image_seq_len)."""
        return self.vision.n_patches // self.scale_factor ** 2


class ModalityProjection(nn.Module):
    def __init__(self, in_dims: int, out_dims: int):
        super().__init__()
        self.proj = nn.Linear(in_dims, out_dims, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.proj(x)


class Connector(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.scale = args.scale_factor
        self.modality_projection = ModalityProjection(args.vision.hidden_size * self.scale ** 2,
                                                      args.text.hidden_size)

    def __call__(self, patches: mx.array) -> mx.array:
        return self.modality_projection(pixel_shuffle(patches, self.scale))


class Idefics3Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.vision_model = siglip.VisionTransformer(args.vision, with_head=False)
        self.connector = Connector(args)
        self.text_model = llama.DecoderModel(args.text)


class Model(Trunk):
    """Text ids [B, L] (queries) -> unit token vectors [B, L, 128]; one input with images through
    embed_with_images."""

    multi_vector = True
    projection_prefix = "linear."  # where a 1_Dense folder's trained projection goes (engine/loading/heads.py)

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Idefics3Model(args)
        self.linear = nn.Linear(args.text.hidden_size, PROJECTION_WIDTH)

    @property
    def hidden_size(self) -> int:
        return PROJECTION_WIDTH

    @property
    def n_positions(self) -> int:
        return self.args.text.max_position_embeddings

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self._token_vectors(self.model.text_model(input_ids, attention_mask))

    def embed_with_images(self, input_ids: mx.array, images: list[dict[str, mx.array]]) -> mx.array:
        """ids [1, L] whose `<image>` runs the images' tiles fill, in order -> unit token vectors [1, L, 128]."""
        text_model = self.model.text_model
        x = text_model.embed(input_ids)
        features = mx.concatenate([self.image_features(image["pixel_values"]) for image in images], axis=0)
        x = place_image_features(x, np.array(input_ids) == self.args.image_token_id, features)
        return self._token_vectors(text_model.decode(x, mx.ones(input_ids.shape, dtype=mx.int32)))

    def image_features(self, pixels: mx.array) -> mx.array:
        """One image's tiles [T, C, H, W] -> its image-token features [T * tokens_per_tile, D_text]."""
        features = self.model.connector(self.model.vision_model.patch_features(pixels))
        return features.reshape(-1, features.shape[-1])

    def _token_vectors(self, hidden: mx.array) -> mx.array:
        return l2_normalize(self.linear(hidden))

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Rotary and position-id buffers dropped; torch's Conv2d filter [out, in, kh, kw] -> MLX's [out, kh, kw, in]."""
        out = {}
        for key, value in weights.items():
            if "rotary_emb." in key or key.endswith("position_ids") or key.startswith("lm_head."):
                continue
            if key.endswith("patch_embedding.weight") and value.shape[1] == self.args.vision.num_channels:
                value = value.transpose(0, 2, 3, 1)
            out[key] = value
        return out
