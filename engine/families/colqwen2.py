"""ColQwen2 and ColQwen2.5: late-interaction retrieval on Qwen2-VL / Qwen2.5-VL (colpali-engine's ColQwen2 and
ColQwen2_5, or transformers' ColQwen2ForRetrieval export over either; its model_type, colqwen2, names the family).

The decoder stops at its final norm (the LM head is never loaded); one Linear projects every token's hidden
state to 128 dimensions, each token vector is L2-normalized and padding rows are zeroed. The result is one
vector per real token (multi-vector), scored against a query with MaxSim. Prompts and images are prepared by
engine/multimodal/builders/colqwen2.py. A query is `Query: ` + text + ten <|endoftext|>, as colpali-engine
0.3.0 - 0.3.12 (2024-09 .. 2025-07) built it when vidore/colqwen2-v0.1, colqwen2-v1.0 and colqwen2.5-v0.1 / v0.2
were trained (colpali-engine 0.3.13+ dropped the prefix for ModernVBERT; transformers' ColQwen2Processor adds a
"\n"); a checkpoint's processor_config.json `query_prefix` wins. The evidence, with commits and dates, is in the
builder's docstring.

Checkpoint layouts (sanitize): colpali-engine merges store model.* (decoder), visual.* and custom_text_proj.*;
transformers' retrieval export nests everything under vlm. (model.language_model.*, model.visual.*) and names
the projection embedding_proj_layer.*; an MLX conversion stores vision_tower.* and a channels-last patch filter.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.errors import InvalidInput, UnsupportedCheckpoint
from engine.families import qwen2, qwen2_5_vl, qwen2_vl
from engine.families.base import Trunk, l2_normalize, place_image_features
from engine.families.mrope import Grid, rope_index
from engine.families.qwen2_vl import TextModel, text_args

# the vision-language models a ColQwen checkpoint is built on, by their model_type: (tower args, tower)
TOWERS = {"qwen2_vl": (qwen2_vl.VisionArgs, qwen2_vl.VisionModel),
          "qwen2_5_vl": (qwen2_5_vl.VisionArgs, qwen2_5_vl.VisionModel)}


@dataclass
class ModelArgs:
    text: qwen2.ModelArgs
    mrope_section: list[int]
    vision: qwen2_vl.VisionArgs  # or qwen2_5_vl's
    image_token_id: int
    embedding_dim: int = 128

    @property
    def hidden_size(self) -> int:
        """The width of what the model returns: one projected vector per token."""
        return self.embedding_dim

    @property
    def max_position_embeddings(self) -> int:
        return self.text.max_position_embeddings

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModelArgs:
        """A colpali-engine merge is the VLM's own config; transformers' export (colqwen2) nests it in vlm_config."""
        embedding_dim = 128
        if config.get("model_type") == "colqwen2":
            embedding_dim = int(config.get("embedding_dim", 128))
            config = config.get("vlm_config") or {}
        kind = config.get("model_type")
        if kind not in TOWERS:
            raise UnsupportedCheckpoint(f"ColQwen checkpoints on {kind!r} are not supported "
                                        f"(supported: {', '.join(TOWERS)})")
        text, section = text_args(config)
        vision = TOWERS[kind][0].from_dict(config.get("vision_config") or {})
        if vision.out_width != text.hidden_size:
            raise UnsupportedCheckpoint(f"{kind}: the vision tower outputs {vision.out_width} values per token, the "
                                        f"decoder's hidden_size is {text.hidden_size}")
        return cls(text=text, mrope_section=section, vision=vision,
                   image_token_id=int(config.get("image_token_id", 151655)), embedding_dim=embedding_dim)


class Model(Trunk):
    """Token ids [B, L] (image rows carrying their runs of <|image_pad|>) + the images' patches -> [B, L, 128]."""

    multi_vector = True

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = TextModel(args.text, args.mrope_section)
        self.visual = TOWERS[args.vision.family][1](args.vision)
        self.custom_text_proj = nn.Linear(args.text.hidden_size, args.embedding_dim)

    @property
    def image_token_id(self) -> int:
        return self.args.image_token_id

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        """A text-only batch (the engine's plain path)."""
        return self.forward(input_ids, attention_mask)

    def forward(self, input_ids: mx.array, attention_mask: mx.array, patches: mx.array | None = None,
                grids: Sequence[Grid] = ()) -> mx.array:
        """ids and mask [B, L] (right or left padded); patches [N, C*T*P*P] of the images whose runs of image
        tokens appear in the rows, in row-major order, with their (t, h, w) grids. Every row gets its own
        M-RoPE positions (a text row's are its real tokens' sequential positions)."""
        ids, mask = np.array(input_ids), np.array(attention_mask)
        try:
            positions = rope_index(ids, mask, grids, self.image_token_id, self.args.vision.spatial_merge_size)
        except ValueError as exc:
            raise InvalidInput(f"image placeholders: {exc}") from None
        x = self.model.embed(input_ids)
        if grids:
            x = self._place_images(x, ids, patches, grids)
        hidden = self.model.run(x, attention_mask, mx.array(positions))
        vectors = l2_normalize(self.custom_text_proj(hidden))
        return vectors * (attention_mask != 0)[..., None].astype(vectors.dtype)

    def embed_with_images(self, input_ids: mx.array, images: list[dict[str, mx.array]]) -> mx.array:
        """One input, ids [1, L] whose <|image_pad|> runs the images fill, in order -> token vectors [1, L, 128]
        (engine/multimodal/inputs.py's contract; each image's arrays: pixel_values and image_grid_thw)."""
        grids = [tuple(int(v) for v in np.array(image["image_grid_thw"])) for image in images]
        patches = mx.concatenate([image["pixel_values"] for image in images]) if images else None
        return self.forward(input_ids, mx.ones(input_ids.shape, dtype=mx.int32), patches, grids)

    def _place_images(self, x: mx.array, ids: np.ndarray, patches: mx.array, grids: Sequence[Grid]) -> mx.array:
        """The images' merged features written over their placeholder tokens, one image through the tower at
        a time (window layout and rotary positions are per image)."""
        features, start = [], 0
        for grid in grids:
            count = int(np.prod(grid))
            features.append(self.visual(patches[start:start + count], grid))
            start += count
        return place_image_features(x, ids == self.image_token_id, mx.concatenate(features))

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Every layout -> model.* (decoder), visual.*, custom_text_proj.*; the LM head and rotary buffers go."""
        out = {}
        for key, value in weights.items():
            key = key.removeprefix("vlm.").removeprefix("base_model.model.")
            if key.startswith("lm_head.") or "rotary_emb." in key or key.endswith("inv_freq"):
                continue
            for old, new in (("embedding_proj_layer.", "custom_text_proj."), ("model.language_model.", "model."),
                             ("language_model.model.", "model."), ("language_model.", "model."),
                             ("model.visual.", "visual."), ("vision_tower.", "visual.")):
                if key.startswith(old):
                    key = new + key[len(old):]
                    break
            if key == "visual.patch_embed.proj.weight" and value.shape[1] != self.args.vision.in_channels:
                value = value.transpose(0, 4, 1, 2, 3)  # MLX's channels-last Conv3d filter -> torch's layout
            out[key] = value
        return out
