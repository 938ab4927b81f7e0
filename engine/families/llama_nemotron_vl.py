"""Llama-Nemotron-VL-Embed (LlamaNemotronVLModel, model_type llama_nemotron_vl): an image-and-text embedder.

Three known pieces composed (seed 001, "Llama-Nemotron-VL-Embed"):
- the SigLIP vision tower under `vision_model.vision_model.`, read at its post-layernorm patch states (what
  `select_layer: -1` selects); its attention-pooling `head.*` is never read and is dropped at load;
- InternVL's pixel shuffle (`downsample_ratio` 0.5: each 2x2 block of patches becomes one token four times as
  wide) and the `mlp1` connector: LayerNorm -> Linear -> GELU (erf) -> Linear, into the decoder's width;
- the bidirectional Llama decoder of `llm_config` (LlamaBidirectionalModel) under `language_model.`, whose
  final normed hidden states the engine mean-pools.

An image's tiles (engine/multimodal/tiles.py) each give (image_size / patch_size)^2 * ratio^2 tokens (256 on the
published checkpoint); their features replace the `<IMG_CONTEXT>` token embeddings in order.

Checkpoint keys, as the published export stores them: `vision_model.vision_model.{embeddings,encoder,
post_layernorm,head}.*`, `mlp1.{0,1,3}.*`, `language_model.{embed_tokens,layers,norm}.*` (a
`language_model.model.` prefix is read as `language_model.`); `lm_head.*` and rotary buffers are dropped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.families import llama, siglip
from engine.families.base import GeluErf, LayerNorm, Trunk, pixel_shuffle, place_image_features

IMAGE_START, IMAGE_END, IMAGE_CONTEXT = "<img>", "</img>", "<IMG_CONTEXT>"
FAMILY = "llama_nemotron_vl"


@dataclass
class ModelArgs:
    vision: siglip.VisionArgs
    llm: llama.ModelArgs
    downsample_ratio: float
    image_token_id: int

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModelArgs:
        vision_config, llm_config = config.get("vision_config"), config.get("llm_config")
        if not isinstance(vision_config, dict) or not isinstance(llm_config, dict):
            raise UnsupportedCheckpoint(f"{FAMILY}: config.json needs both vision_config and llm_config")
        if vision_config.get("model_type", "siglip_vision_model") != "siglip_vision_model":
            raise UnsupportedCheckpoint(f"{FAMILY}: vision tower {vision_config.get('model_type')!r} is not "
                                        "supported (supported: siglip_vision_model)")
        llm_arch = (llm_config.get("architectures") or ["LlamaBidirectionalModel"])[0]
        if llm_arch != "LlamaBidirectionalModel":
            raise UnsupportedCheckpoint(f"{FAMILY}: language model {llm_arch!r} is not supported "
                                        "(supported: LlamaBidirectionalModel)")
        if config.get("select_layer", -1) != -1:
            raise UnsupportedCheckpoint(f"{FAMILY}: select_layer {config['select_layer']} is not supported "
                                        "(only -1, the tower's post-layernorm output)")
        if config.get("ps_version", "v2") != "v2":
            raise UnsupportedCheckpoint(f"{FAMILY}: pixel shuffle {config['ps_version']!r} is not supported (only v2)")
        # LlamaBidirectionalModel attends both ways whatever its config's flags say
        llm = llama.ModelArgs.from_dict({**llm_config, "model_type": "llama_bidirec"})
        vision = siglip.VisionArgs.from_dict(vision_config)
        side = config.get("force_image_size") or vision.image_size
        if side != vision.image_size:
            raise UnsupportedCheckpoint(f"{FAMILY}: force_image_size {side} differs from the tower's image_size "
                                        f"{vision.image_size} (its position table is fixed)")
        ratio = float(config.get("downsample_ratio", 0.5))
        grid = vision.image_size // vision.patch_size
        factor = round(1 / ratio)
        if not math.isclose(factor * ratio, 1.0) or grid % factor:
            raise UnsupportedCheckpoint(f"{FAMILY}: downsample_ratio {ratio} does not divide the {grid}x{grid} "
                                        "patch grid into whole blocks")
        if "img_context_token_id" not in config:
            raise UnsupportedCheckpoint(f"{FAMILY}: config.json has no img_context_token_id")
        return cls(vision=vision, llm=llm, downsample_ratio=ratio, image_token_id=int(config["img_context_token_id"]))

    @property
    def shuffle_factor(self) -> int:
        """Patches per side merged into one token (2 for downsample_ratio 0.5)."""
        return round(1 / self.downsample_ratio)

    @property
    def tokens_per_tile(self) -> int:
        return (self.vision.image_size // self.vision.patch_size // self.shuffle_factor) ** 2


class VisionModel(nn.Module):
    """transformers' SiglipVisionModel wrapper, whose tower sits one level down (`vision_model.vision_model.`)."""

    def __init__(self, args: siglip.VisionArgs):
        super().__init__()
        self.vision_model = siglip.VisionTransformer(args, with_head=False)


class Model(Trunk):
    """Token ids [B, L] (and, for an image input, its tiles) -> final normed hidden states [B, L, D]."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.config = args
        self.args = args.llm  # what the engine reads: hidden_size, max_position_embeddings
        self.vision_model = VisionModel(args.vision)
        width = args.vision.hidden_size * args.shuffle_factor ** 2
        self.mlp1 = [LayerNorm(width), nn.Linear(width, args.llm.hidden_size), GeluErf(),
                     nn.Linear(args.llm.hidden_size, args.llm.hidden_size)]
        self.language_model = llama.DecoderModel(args.llm)

    @property
    def image_token_id(self) -> int:
        return self.config.image_token_id

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.language_model(input_ids, attention_mask)

    def image_features(self, tiles: mx.array) -> mx.array:
        """Tiles [T, 3, S, S] (normalized pixels) -> their tokens in the decoder's width [T * tokens_per_tile, D]."""
        patches = self.vision_model.vision_model.patch_features(tiles)
        x = pixel_shuffle(patches, self.config.shuffle_factor)
        for layer in self.mlp1:
            x = layer(x)
        return x.reshape(-1, x.shape[-1])

    def embed_with_images(self, input_ids: mx.array, images: list[dict[str, mx.array]]) -> mx.array:
        """One input's ids [1, L] and its images' arrays (`pixel_values` [tiles, 3, S, S] each, in prompt order)
        -> final normed hidden states [1, L, D], the `<IMG_CONTEXT>` positions taking the tiles' features in order.

        The number of context tokens must equal tiles * tokens_per_tile: the prompt was expanded for these tiles."""
        tiles = mx.concatenate([image["pixel_values"] for image in images], axis=0)
        features = self.image_features(tiles)
        merged = place_image_features(self.language_model.embed(input_ids),
                                      np.array(input_ids) == self.config.image_token_id, features)
        return self.language_model.decode(merged, mx.ones(input_ids.shape, dtype=mx.int32))

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Drop what an embedder never reads (the SigLIP pooling head, an LM head, rotary buffers, position ids);
        read `language_model.model.` as `language_model.`; torch's Conv2d filter becomes channels-last."""
        out = {}
        for key, value in weights.items():
            if (key.startswith(("vision_model.vision_model.head.", "lm_head.", "language_model.lm_head."))
                    or "rotary_emb." in key or key.endswith("position_ids")):
                continue
            if key.startswith("language_model.model."):
                key = "language_model." + key[len("language_model.model."):]
            if key == "vision_model.vision_model.embeddings.patch_embedding.weight" and \
                    value.shape[1] == self.config.vision.num_channels:
                value = value.transpose(0, 2, 3, 1)
            out[key] = value
        return out



def image_block(n_tokens: int) -> str:
    """The text an image becomes in the reference's document prompt: its context-token run framed by the
    image markers, then a space (the reference writes `<image> ` and replaces `<image>`)."""
    return f"{IMAGE_START}{IMAGE_CONTEXT * n_tokens}{IMAGE_END} "
