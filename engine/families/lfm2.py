"""LFM2 (Lfm2ForCausalLM / Lfm2Model) with --embedding, and its bidirectional encoder (Lfm2BidirectionalModel:
LFM2.5-Embedding, and the LFM2 / LFM2.5 ColBERT late-interaction retrievers).

A conv layer gates a depthwise convolution of kernel conv_L_cache: in_proj makes B, C and x; C * conv(B * x)
goes through out_proj; padding positions are zeroed before it, as transformers does. Attention layers are
Llama's with RMSNorm on each head's query and key (q_layernorm / k_layernorm) and an `out_proj` (llama's
attention, keys renamed by sanitize). Every layer is pre-norm (operator_norm, ffn_norm) with a SwiGLU
feed_forward (w1, w3, w2); `embedding_norm` is the final norm.

The causal model's convolution reads the past (L_cache - 1 zeros before the row). The bidirectional one
(architectures Lfm2BidirectionalModel, model_type lfm2_bidirectional, or is_causal: false) is centered, as
transformers' Lfm2BidirectionalShortConv: L_cache // 2 zeros before the row and the rest after, so with
L_cache 3 position t mixes t - 1, t and t + 1; its attention has no causal mask. Padding is zeroed at the
convolution's input and again at B * x (where a conv bias would otherwise make it non-zero), so a padded
row equals the row alone: a padded position reads like the zeros past the end of a row.

ColBERT (late interaction): the same backbone, then the checkpoint's 1_Dense projection applied to every
token and each token vector L2-normalized (pylate's ColBERT), scored with MaxSim. pylate's query and document
formats (the [Q] / [D] prefix token, query expansion, the lengths, the document skiplist) are the request side's:
engine/text/late_interaction.py. An expanded query's expansion tokens are run but masked out of attention
(attend_to_expansion_tokens false) and still give vectors: for them this backbone follows transformers exactly
(every position at its index, a masked query attending to the real tokens only).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint
from engine.families import llama
from engine.families.base import (BaseModelArgs, Mask, Rotary, checked_layer_types, is_bidirectional, l2_normalize,
                                   rope_settings, take_rows, token_positions)

CONV, FULL = "conv", "full_attention"
BIDIRECTIONAL_TYPE = "lfm2_bidirectional"  # transformers' model_type of Lfm2BidirectionalModel


@dataclass
class ModelArgs(BaseModelArgs):
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int = 12288
    num_key_value_heads: int | None = None
    max_position_embeddings: int = 128_000
    norm_eps: float = 1e-5
    conv_bias: bool = False
    conv_L_cache: int = 3
    block_multiple_of: int = 256
    block_ffn_dim_multiplier: float | None = 1.0
    block_auto_adjust_ff_dim: bool = True
    full_attn_idxs: list[int] | None = None
    block_ff_dim: int | None = None  # the hub's older name of intermediate_size
    layer_types: list[str] | None = None
    rope_theta: float | None = None
    rope_parameters: dict[str, Any] | None = None
    rope_scaling: dict[str, Any] | None = None
    model_type: str = "lfm2"
    is_causal: bool | None = None
    use_bidirectional_attention: bool | None = None
    architectures: list[str] | None = None
    head_dim: int = field(init=False)
    ff_dim: int = field(init=False)
    rope: dict[str, Any] = field(init=False)
    causal: bool = field(init=False)

    def __post_init__(self):
        self.causal = not (is_bidirectional(self.model_type, self.is_causal, self.use_bidirectional_attention)
                           or self.model_type == BIDIRECTIONAL_TYPE
                           or (self.architectures or [""])[0].startswith("Lfm2Bidirectional"))
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        self.head_dim = self.hidden_size // self.num_attention_heads
        if self.layer_types is None:
            full = set(self.full_attn_idxs if self.full_attn_idxs is not None else range(self.num_hidden_layers))
            self.layer_types = [FULL if i in full else CONV for i in range(self.num_hidden_layers)]
        self.layer_types = checked_layer_types("LFM2", self.layer_types, self.num_hidden_layers, (CONV, FULL))
        self.ff_dim = self.block_ff_dim or self.intermediate_size
        if self.block_auto_adjust_ff_dim:  # transformers' Lfm2MLP sizing rule
            self.ff_dim = int(2 * self.ff_dim / 3)
            if self.block_ffn_dim_multiplier is not None:
                self.ff_dim = int(self.block_ffn_dim_multiplier * self.ff_dim)
                self.ff_dim = self.block_multiple_of * ((self.ff_dim + self.block_multiple_of - 1)
                                                       // self.block_multiple_of)
        self.rope = rope_settings("LFM2", self.rope_parameters, self.rope_scaling, self.rope_theta, 1_000_000.0)

    # llama's attention serves the full_attention layers (sanitize renames out_proj / q_layernorm / k_layernorm)
    qkv_bias = o_bias = False
    qk_norm = True

    @property
    def rms_norm_eps(self) -> float:
        return self.norm_eps

    def window(self, layer_type: str) -> int | None:
        return None

    def rope_of(self, layer_type: str) -> dict[str, Any]:
        return self.rope


class DepthwiseConv(nn.Module):
    """The checkpoint's conv.weight [H, 1, L] (+ bias [H]): y[t] = sum_k w[k] * x[t - before + k], zeros outside
    the row; before = L - 1 (causal) or L // 2 (centered, the bidirectional encoder)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.causal = args.causal
        self.weight = mx.zeros((args.hidden_size, 1, args.conv_L_cache))
        if args.conv_bias:
            self.bias = mx.zeros((args.hidden_size,))

    def __call__(self, x: mx.array) -> mx.array:
        """x [B, L, H] -> [B, L, H]."""
        kernel = self.weight.shape[-1]
        length = x.shape[1]
        before = kernel - 1 if self.causal else kernel // 2
        padded = mx.pad(x, [(0, 0), (before, kernel - 1 - before), (0, 0)])
        out = sum(padded[:, k:k + length] * self.weight[:, 0, k] for k in range(kernel))
        return out + self.bias if "bias" in self else out


class ShortConv(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.in_proj = nn.Linear(args.hidden_size, 3 * args.hidden_size, bias=args.conv_bias)
        self.conv = DepthwiseConv(args)
        self.out_proj = nn.Linear(args.hidden_size, args.hidden_size, bias=args.conv_bias)

    def __call__(self, x: mx.array, keep: mx.array) -> mx.array:
        keep = keep.astype(x.dtype)
        b, c, h = mx.split(self.in_proj(x * keep), 3, axis=-1)
        return self.out_proj(c * self.conv(b * h * keep))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.hidden_size, args.ff_dim, bias=False)
        self.w3 = nn.Linear(args.hidden_size, args.ff_dim, bias=False)
        self.w2 = nn.Linear(args.ff_dim, args.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.w2(nn.silu(self.w1(x)) * self.w3(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        if layer_type == FULL:
            self.self_attn = llama.Attention(args)
        else:
            self.conv = ShortConv(args)
        self.feed_forward = FeedForward(args)
        self.operator_norm = nn.RMSNorm(args.hidden_size, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.hidden_size, eps=args.norm_eps)

    def __call__(self, x: mx.array, mask: Mask | mx.array, rope: Rotary, rows: mx.array | None = None) -> mx.array:
        normed = self.operator_norm(x)
        if self.layer_type == FULL:
            h = (x if rows is None else take_rows(x, rows)) + self.self_attn(normed, mask, rope, rows=rows)
        else:  # a conv layer's "mask" is the padding multiplier [B, L, 1] (see Lfm2Model.layer_masks)
            h = x + self.conv(normed, mask)
            if rows is not None:  # the convolution reads its neighbours: every position, then the rows
                h = take_rows(h, rows)
        return h + self.feed_forward(self.ffn_norm(h))


class Lfm2Model(llama.DecoderModel):
    """The final norm is the checkpoint's `embedding_norm` (renamed to `norm` by sanitize)."""

    block = DecoderLayer
    # ColBERT sets it: a masked position's row is an output too (pylate's query expansion tokens, run but not
    # attended to), so every position gets transformers' position (its index) and a masked query sees the real
    # tokens only, not itself
    keeps_masked_rows = False

    def layer_masks(self, attention_mask: mx.array, kinds: set[str]) -> dict[str, mx.array]:
        masks = super().layer_masks(attention_mask, kinds - {CONV})
        if self.keeps_masked_rows and FULL in kinds:
            masks[FULL] = Mask(attention_mask != 0, causal=self.args.causal, source=attention_mask)
        if CONV in kinds:  # padding zeroed before the convolution, as transformers does
            masks[CONV] = (attention_mask != 0)[..., None]
        return masks

    def position_tables(self, positions: mx.array, kind: str, attention_mask: mx.array) -> tuple:
        if self.keeps_masked_rows:
            every = mx.ones_like(attention_mask)
            return super().position_tables(token_positions(every), kind, every)
        return super().position_tables(positions, kind, attention_mask)


class Model(llama.Model):
    """The backbone under `model.`; the tied head is never applied."""

    backbone = Lfm2Model

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        renames = {"model.embedding_norm.": "model.norm.", ".self_attn.out_proj.": ".self_attn.o_proj.",
                   ".self_attn.q_layernorm.": ".self_attn.q_norm.", ".self_attn.k_layernorm.": ".self_attn.k_norm."}
        out = {}
        for key, value in llama.backbone_weights(weights, keep_head=False).items():
            for old, new in renames.items():
                key = key.replace(old, new)
            out[key] = value
        kernel = self.args.conv_L_cache
        for key, value in out.items():
            if key.endswith("conv.conv.weight") and value.ndim == 3 and value.shape[1] == kernel:
                out[key] = value.swapaxes(1, 2)  # MLX conversions store [H, L, 1]
        return out


class ColBERT(Model):
    """pylate's ColBERT on this backbone (LFM2-ColBERT-350M, LFM2.5-ColBERT-350M): every token's final hidden
    state through the checkpoint's 1_Dense projection (`linear`), then L2-normalized on its own. The projection's
    width is the Dense weight's, known once the weights are read (sanitize)."""

    multi_vector = True
    late_interaction = True  # its texts take pylate's query / document formats (engine/text/late_interaction.py)
    projection_prefix = "linear."  # where the 1_Dense folder's weights go (engine/loading/heads.py)
    computes_needed_rows = False  # every token's vector is its output

    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.model.keeps_masked_rows = True
        self.linear = nn.Linear(args.hidden_size, args.hidden_size, bias=False)  # resized by sanitize

    @property
    def hidden_size(self) -> int:
        return self.linear.weight.shape[0]

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return l2_normalize(self.linear(self.model(input_ids, attention_mask)))

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        projection = {k: v for k, v in weights.items() if k.startswith(self.projection_prefix)}
        weight = projection.get(f"{self.projection_prefix}weight")
        if weight is None or weight.ndim != 2 or weight.shape[1] != self.args.hidden_size:
            raise UnsupportedCheckpoint(f"an LFM2 ColBERT checkpoint needs its 1_Dense projection from the hidden "
                                        f"size {self.args.hidden_size}; found {None if weight is None else weight.shape}")
        self.linear = nn.Linear(weight.shape[1], weight.shape[0], bias=f"{self.projection_prefix}bias" in projection)
        rest = {k: v for k, v in weights.items() if k not in projection}
        return {**super().sanitize(rest), **projection}
