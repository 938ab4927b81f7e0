"""SigLIP (SiglipModel, SiglipTextModel): a text tower and, in a SiglipModel, a vision tower whose image
embeddings land in the same space as the text embeddings.

The text tower was trained on rows of exactly `max_position_embeddings` (64) tokens, right-padded with the
pad token and run with NO attention mask; its embedding is the hidden state at the LAST position (a pad
token for short inputs: the model learned to gather the sentence there) through `head`. So the family
pools itself and asks the engine for one fixed row width. The vision tower embeds a fixed-size image as
patches + learned positions, the same pre-norm encoder, a post-layernorm and an attention-pooling head.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint
from engine.families.base import BaseModelArgs, LayerNorm, Trunk, activation, softmax, split_heads


@dataclass
class TowerArgs(BaseModelArgs):
    # transformers' SigLIP config defaults, shared by both towers: published configs omit most keys.
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"


@dataclass
class TextArgs(TowerArgs):
    vocab_size: int = 32000
    max_position_embeddings: int = 64
    projection_size: int | None = None

    def __post_init__(self):
        self.projection_size = self.projection_size or self.hidden_size


@dataclass
class VisionArgs(TowerArgs):
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 16
    vision_use_head: bool = True

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass
class ModelArgs:
    text: TextArgs
    vision: VisionArgs | None = None

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModelArgs:
        """A SiglipModel config nests text_config / vision_config; a SiglipTextModel config is the text one."""
        if "text_config" in config or "vision_config" in config:
            text = TextArgs.from_dict(config.get("text_config") or {})
            vision = VisionArgs.from_dict(config.get("vision_config") or {})
            if not vision.vision_use_head:
                raise UnsupportedCheckpoint("SigLIP vision towers without the attention-pooling head "
                                            "(vision_use_head: false) are not supported")
            if vision.hidden_size != text.projection_size:
                raise UnsupportedCheckpoint(
                    f"SigLIP image embeddings ({vision.hidden_size} wide) and text embeddings "
                    f"({text.projection_size} wide) must have one width to share a space")
            return cls(text=text, vision=vision)
        return cls(text=TextArgs.from_dict(config))


def attend(q: mx.array, k: mx.array, v: mx.array) -> mx.array:
    """Unmasked attention over [B, H, L, Dh] heads -> [B, Lq, H * Dh]."""
    out = softmax((q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(0, 1, 3, 2)) @ v
    b, h, length, dh = out.shape
    return out.transpose(0, 2, 1, 3).reshape(b, length, h * dh)


class Attention(nn.Module):
    """Every position attends to every position: SigLIP passes no mask in either tower."""

    def __init__(self, hidden_size: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, hidden_size)
        self.v_proj = nn.Linear(hidden_size, hidden_size)
        self.out_proj = nn.Linear(hidden_size, hidden_size)

    def __call__(self, x: mx.array) -> mx.array:
        q, k, v = (split_heads(proj(x), self.n_heads) for proj in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(attend(q, k, v))


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, act: str):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size)
        self.fc2 = nn.Linear(intermediate_size, hidden_size)
        self.act = activation(act)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc2(self.act(self.fc1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, args: TowerArgs):
        super().__init__()
        self.layer_norm1 = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.self_attn = Attention(args.hidden_size, args.num_attention_heads)
        self.layer_norm2 = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.mlp = MLP(args.hidden_size, args.intermediate_size, args.hidden_act)

    def __call__(self, x: mx.array) -> mx.array:
        h = x + self.self_attn(self.layer_norm1(x))
        return h + self.mlp(self.layer_norm2(h))


class Encoder(nn.Module):
    def __init__(self, args: TowerArgs):
        super().__init__()
        self.layers = [EncoderLayer(args) for _ in range(args.num_hidden_layers)]

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.layers:
            x = layer(x)
        return x


class TextEmbeddings(nn.Module):
    def __init__(self, args: TextArgs):
        super().__init__()
        self.token_embedding = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embedding = nn.Embedding(args.max_position_embeddings, args.hidden_size)

    def __call__(self, input_ids: mx.array) -> mx.array:
        # through the module, not its .weight: a quantized table (engine/loading/weights.py) is codes there
        return self.token_embedding(input_ids) + self.position_embedding(mx.arange(input_ids.shape[1]))


class TextTransformer(nn.Module):
    def __init__(self, args: TextArgs):
        super().__init__()
        self.embeddings = TextEmbeddings(args)
        self.encoder = Encoder(args)
        self.final_layer_norm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.head = nn.Linear(args.hidden_size, args.projection_size)

    def __call__(self, input_ids: mx.array) -> mx.array:
        hidden = self.final_layer_norm(self.encoder(self.embeddings(input_ids)))
        return self.head(hidden[:, -1, :])


class VisionEmbeddings(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.patch_embedding = nn.Conv2d(args.num_channels, args.hidden_size, kernel_size=args.patch_size,
                                         stride=args.patch_size)
        self.position_embedding = nn.Embedding(args.n_patches, args.hidden_size)

    def __call__(self, pixels: mx.array) -> mx.array:
        """pixels [B, C, H, W] (the processor's layout) -> patch embeddings [B, n_patches, D], row-major."""
        patches = self.patch_embedding(pixels.transpose(0, 2, 3, 1))  # MLX convolves channels-last
        b, gh, gw, d = patches.shape
        return patches.reshape(b, gh * gw, d) + self.position_embedding(mx.arange(gh * gw))


class PoolingAttention(nn.Module):
    """torch.nn.MultiheadAttention's layout (packed in_proj), for the one-query pooling head."""

    def __init__(self, hidden_size: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.in_proj_weight = mx.zeros((3 * hidden_size, hidden_size))
        self.in_proj_bias = mx.zeros((3 * hidden_size,))
        self.out_proj = nn.Linear(hidden_size, hidden_size)

    def __call__(self, query: mx.array, x: mx.array) -> mx.array:
        wq, wk, wv = mx.split(self.in_proj_weight, 3, axis=0)
        bq, bk, bv = mx.split(self.in_proj_bias, 3, axis=0)
        q, k, v = (split_heads(t @ w.T + b, self.n_heads) for t, w, b in ((query, wq, bq), (x, wk, bk), (x, wv, bv)))
        return self.out_proj(attend(q, k, v))


class AttentionPoolingHead(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.probe = mx.zeros((1, 1, args.hidden_size))
        self.attention = PoolingAttention(args.hidden_size, args.num_attention_heads)
        self.layernorm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.mlp = MLP(args.hidden_size, args.intermediate_size, args.hidden_act)

    def __call__(self, x: mx.array) -> mx.array:
        pooled = self.attention(mx.broadcast_to(self.probe, (x.shape[0], 1, x.shape[2])), x)
        return (pooled + self.mlp(self.layernorm(pooled)))[:, 0]


class VisionTransformer(nn.Module):
    """with_head=False: a tower read for its patch features (a VLM's vision encoder), whose head is never built."""

    def __init__(self, args: VisionArgs, with_head: bool = True):
        super().__init__()
        self.embeddings = VisionEmbeddings(args)
        self.encoder = Encoder(args)
        self.post_layernorm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        if with_head:
            self.head = AttentionPoolingHead(args)

    def patch_features(self, pixels: mx.array) -> mx.array:
        """pixels [B, C, H, W] -> post-layernorm patch states [B, n_patches, D] (transformers' last_hidden_state)."""
        return self.post_layernorm(self.encoder(self.embeddings(pixels)))

    def __call__(self, pixels: mx.array) -> mx.array:
        return self.head(self.patch_features(pixels))


class Model(Trunk):
    """Text ids [B, 64] -> text embeddings [B, D]; pixels [B, C, H, W] -> image embeddings [B, D]."""

    pools_itself = True  # the engine's pooling does not apply: the towers end in their own heads

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.text_model = TextTransformer(args.text)
        if args.vision is not None:
            self.vision_model = VisionTransformer(args.vision)

    @property
    def hidden_size(self) -> int:
        return self.args.text.projection_size

    @property
    def n_positions(self) -> int:
        return self.args.text.max_position_embeddings

    @property
    def fixed_width(self) -> int:
        """Every text row is padded to this many tokens, the width the tower was trained on."""
        return self.args.text.max_position_embeddings

    @property
    def image_size(self) -> int | None:
        """The square side the vision tower takes, or None for a text-only checkpoint."""
        return self.args.vision.image_size if self.args.vision is not None else None

    @property
    def image_tokens(self) -> int:
        """Patches per image: what one image counts as in usage and batch budgets."""
        return self.args.vision.n_patches if self.args.vision is not None else 0

    def __call__(self, input_ids: mx.array, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None) -> mx.array:
        """The mask is ignored on purpose: the tower attends over its pad tokens, as in training."""
        return self.text_model(input_ids)

    def embed_images(self, pixels: mx.array) -> mx.array:
        return self.vision_model(pixels)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Keep the towers this checkpoint serves; logit_scale/bias and position_ids buffers are unused.

        A SiglipTextModel saved bare (embeddings.*, encoder.*, ...) gets the text_model. prefix; torch's
        Conv2d filter [out, in, kh, kw] becomes MLX's channels-last [out, kh, kw, in].
        """
        out = {}
        for key, value in weights.items():
            if key.endswith("position_ids") or key in ("logit_scale", "logit_bias"):
                continue
            if key.startswith(("embeddings.", "encoder.", "final_layer_norm.", "head.")):
                key = "text_model." + key
            if key.startswith("vision_model.") and self.args.vision is None:
                continue
            if key == "vision_model.embeddings.patch_embedding.weight" and value.shape[1] == self.args.vision.num_channels:
                value = value.transpose(0, 2, 3, 1)
            out[key] = value
        return out
