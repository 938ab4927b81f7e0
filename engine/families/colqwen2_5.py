"""ColQwen2.5: late-interaction retrieval on Qwen2.5-VL (colpali-engine's ColQwen2_5, or transformers'
ColQwen2ForRetrieval export over a qwen2_5_vl model).

The decoder stops at its final norm (the LM head is never loaded); one Linear projects every token's hidden
state to 128 dimensions, each token vector is L2-normalized and padding rows are zeroed. The result is one
vector per real token (multi-vector), scored against a query with MaxSim. Prompts are the family's own, as
colpali-engine's processor makes them: a page is DOCUMENT_PROMPT with its <|image_pad|> grown to one token per
merged patch block; a query is the text followed by ten <|endoftext|> (extra vectors MaxSim can match with).

Checkpoint layouts (sanitize): colpali-engine merges store model.* (decoder), visual.* and custom_text_proj.*;
transformers' retrieval export nests everything under vlm. (model.language_model.*, model.visual.*) and names
the projection embedding_proj_layer.*; an MLX conversion stores vision_tower.* and a channels-last patch filter.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.errors import InvalidInput, UnsupportedCheckpoint
from engine.families import qwen2
from engine.families.qwen2_5_vl import TextModel, VisionArgs, VisionModel, rope_index, text_args
from engine.images_qwen import QwenImage

DOCUMENT_PROMPT = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|>"
                   "<|endoftext|>")
IMAGE_TOKEN = "<|image_pad|>"
QUERY_PREFIX = ""
QUERY_SUFFIX = "<|endoftext|>" * 10
ARCHITECTURES = ("ColQwen2_5", "ColQwen2ForRetrieval")


@dataclass
class ModelArgs:
    text: qwen2.ModelArgs
    mrope_section: list[int]
    vision: VisionArgs
    image_token_id: int
    embedding_dim: int = 128

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModelArgs:
        """A colpali-engine merge is a qwen2_5_vl config; transformers' export (colqwen2) nests it in vlm_config."""
        embedding_dim = 128
        if config.get("model_type") == "colqwen2":
            embedding_dim = int(config.get("embedding_dim", 128))
            config = config.get("vlm_config") or {}
        if config.get("model_type") != "qwen2_5_vl":
            raise UnsupportedCheckpoint(f"ColQwen checkpoints on {config.get('model_type')!r} are not supported "
                                        "(supported: qwen2_5_vl, i.e. ColQwen2.5)")
        text, section = text_args(config)
        vision = VisionArgs.from_dict(config.get("vision_config") or {})
        if vision.out_hidden_size != text.hidden_size:
            raise UnsupportedCheckpoint(f"qwen2_5_vl vision out_hidden_size {vision.out_hidden_size} differs from "
                                        f"the decoder's hidden_size {text.hidden_size}")
        return cls(text=text, mrope_section=section, vision=vision,
                   image_token_id=int(config.get("image_token_id", 151655)), embedding_dim=embedding_dim)


class Model(nn.Module):
    """Token ids [B, L] (image rows carrying their expanded placeholder) + images -> [B, L, 128] token vectors."""

    multi_vector = True

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = TextModel(args.text, args.mrope_section)
        self.visual = VisionModel(args.vision)
        self.custom_text_proj = nn.Linear(args.text.hidden_size, args.embedding_dim)

    @property
    def hidden_size(self) -> int:
        return self.args.embedding_dim

    @property
    def n_positions(self) -> int:
        return self.args.text.max_position_embeddings

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 images: Sequence[Sequence[QwenImage]] | None = None) -> mx.array:
        """images[b]: row b's images in placeholder order (an empty list for a text row).

        A batch without images uses sequential positions; otherwise each row gets its own M-RoPE positions
        (a text row's are sequential over its real tokens, the same numbers).
        """
        x = self.model.embed(input_ids)
        ids, mask = np.array(input_ids), np.array(attention_mask)
        if images and any(images):
            x = self._place_images(x, ids, images)
            positions = np.stack([rope_index(ids[b], mask[b], [image.grid_thw for image in images[b]],
                                             self.args.image_token_id, self.args.vision.spatial_merge_size)
                                  for b in range(len(ids))], axis=1)
        else:
            positions = np.broadcast_to(np.maximum(np.cumsum(mask != 0, axis=1) - 1, 0), (3, *ids.shape))
        hidden = self.model.run(x, attention_mask, mx.array(positions.astype(np.int32)))
        vectors = self.custom_text_proj(hidden)
        norms = mx.sqrt(mx.sum(vectors * vectors, axis=-1, keepdims=True))
        return vectors / mx.maximum(norms, 1e-12) * (attention_mask != 0)[..., None].astype(vectors.dtype)

    def expand_image_tokens(self, ids: list[int], images: Sequence[QwenImage]) -> list[int]:
        """Each single <|image_pad|> of a tokenized prompt grown to its image's token count, in order."""
        pad = self.args.image_token_id
        if ids.count(pad) != len(images):
            raise InvalidInput(f"the prompt has {ids.count(pad)} image placeholders for {len(images)} images")
        sizes = iter(image.n_tokens for image in images)
        return [token for t in ids for token in ([t] * next(sizes) if t == pad else [t])]

    def embed_image(self, image: QwenImage) -> mx.array:
        """One image's merged features [n_tokens, hidden_size], the decoder's input at its placeholders."""
        return self.visual(mx.array(image.pixel_values), image.grid_thw)

    def _place_images(self, x: mx.array, ids: np.ndarray, images: Sequence[Sequence[QwenImage]]) -> mx.array:
        batch, length, width = x.shape
        slots, features = [], []
        for b, row_images in enumerate(images):
            placeholders = np.flatnonzero(ids[b] == self.args.image_token_id)
            expected = sum(image.n_tokens for image in row_images)
            if len(placeholders) != expected:
                raise InvalidInput(f"row {b} has {len(placeholders)} image placeholder tokens for images of "
                                   f"{expected} tokens")
            slots.append(b * length + placeholders)
            features.extend(self.embed_image(image) for image in row_images)
        flat = x.reshape(batch * length, width)
        flat[mx.array(np.concatenate(slots).astype(np.int32))] = mx.concatenate(features).astype(x.dtype)
        return flat.reshape(batch, length, width)

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
