"""T5's encoder (T5EncoderModel, as sentence-t5 and gtr-t5 publish it; the encoder of T5Model /
T5ForConditionalGeneration, as sentence-transformers loads any T5 checkpoint).

Pre-norm blocks: x + SelfAttention(layer_norm(x)), then x + DenseReluDense(layer_norm(x)), a final layer norm.
T5's layer norm is RMS-style (a scale, no mean, no bias); no linear layer has a bias; the attention scores are
not scaled (T5 folds 1/sqrt(d_kv) into its initialization) and get a relative position bias that the first block
owns (T5's bidirectional buckets over relative_attention_num_buckets / _max_distance) and every block adds.
The token embedding is not scaled and there is no position table. The feed-forward block is plain
(`feed_forward_proj` "relu", "gelu", ...: wi, act, wo) or gated ("gated-gelu", "gated-silu": act(wi_0) * wi_1,
wo), with transformers' reading of the name ("gated-gelu" is the tanh GELU).
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint
from engine.families.base import (
    BaseModelArgs,
    Trunk,
    activation,
    attention,
    padding_mask,
    relative_position_buckets,
    sequence_mask,
    split_heads,
)


@dataclass
class ModelArgs(BaseModelArgs):
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    n_positions: int = 512  # what the checkpoints were trained on (relative positions reach any length)
    is_causal: bool = False  # a t5encoder GGUF as llama.cpp runs it (engine/loading/gguf/arch/t5encoder.py)

    def __post_init__(self):
        parts = self.feed_forward_proj.split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
            raise UnsupportedCheckpoint(f"T5 feed_forward_proj {self.feed_forward_proj!r} is not supported "
                                        f"('ACT' or 'gated-ACT')")

    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def is_gated(self) -> bool:
        return self.feed_forward_proj.startswith("gated-")

    @property
    def act(self) -> str:
        # transformers' T5Config: "gated-gelu" keeps its original meaning, the tanh approximation
        return "gelu_new" if self.feed_forward_proj == "gated-gelu" else self.feed_forward_proj.split("-")[-1]


class T5Attention(nn.Module):
    def __init__(self, args: ModelArgs, has_relative_attention_bias: bool):
        super().__init__()
        self.n_heads = args.num_heads
        inner = args.num_heads * args.d_kv
        self.q = nn.Linear(args.d_model, inner, bias=False)
        self.k = nn.Linear(args.d_model, inner, bias=False)
        self.v = nn.Linear(args.d_model, inner, bias=False)
        self.o = nn.Linear(inner, args.d_model, bias=False)
        if has_relative_attention_bias:
            self.relative_attention_bias = nn.Embedding(args.relative_attention_num_buckets, args.num_heads)

    def __call__(self, x: mx.array, mask: mx.array, position_bias: mx.array) -> mx.array:
        q, k, v = (split_heads(proj(x), self.n_heads) for proj in (self.q, self.k, self.v))
        return self.o(attention(q, k, v, mask, scale=1.0, bias=position_bias))


class T5LayerSelfAttention(nn.Module):
    def __init__(self, args: ModelArgs, has_relative_attention_bias: bool):
        super().__init__()
        self.SelfAttention = T5Attention(args, has_relative_attention_bias)
        self.layer_norm = nn.RMSNorm(args.d_model, eps=args.layer_norm_epsilon)

    def __call__(self, x: mx.array, mask: mx.array, position_bias: mx.array) -> mx.array:
        return x + self.SelfAttention(self.layer_norm(x), mask, position_bias)


class T5DenseActDense(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.wi = nn.Linear(args.d_model, args.d_ff, bias=False)
        self.wo = nn.Linear(args.d_ff, args.d_model, bias=False)
        self.act = activation(args.act)

    def __call__(self, x: mx.array) -> mx.array:
        return self.wo(self.act(self.wi(x)))


class T5DenseGatedActDense(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.wi_0 = nn.Linear(args.d_model, args.d_ff, bias=False)
        self.wi_1 = nn.Linear(args.d_model, args.d_ff, bias=False)
        self.wo = nn.Linear(args.d_ff, args.d_model, bias=False)
        self.act = activation(args.act)

    def __call__(self, x: mx.array) -> mx.array:
        return self.wo(self.act(self.wi_0(x)) * self.wi_1(x))


class T5LayerFF(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.DenseReluDense = T5DenseGatedActDense(args) if args.is_gated else T5DenseActDense(args)
        self.layer_norm = nn.RMSNorm(args.d_model, eps=args.layer_norm_epsilon)

    def __call__(self, x: mx.array) -> mx.array:
        return x + self.DenseReluDense(self.layer_norm(x))


class T5Block(nn.Module):
    def __init__(self, args: ModelArgs, has_relative_attention_bias: bool):
        super().__init__()
        self.layer = [T5LayerSelfAttention(args, has_relative_attention_bias), T5LayerFF(args)]

    def __call__(self, x: mx.array, mask: mx.array, position_bias: mx.array) -> mx.array:
        return self.layer[1](self.layer[0](x, mask, position_bias))


class T5Stack(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.block = [T5Block(args, has_relative_attention_bias=i == 0) for i in range(args.num_layers)]
        self.final_layer_norm = nn.RMSNorm(args.d_model, eps=args.layer_norm_epsilon)

    def position_bias(self, length: int) -> mx.array:
        """[1, H, L, L] from the first block's table, shared by every block."""
        buckets = relative_position_buckets(length, self.args.relative_attention_num_buckets,
                                            self.args.relative_attention_max_distance)
        table = self.block[0].layer[0].SelfAttention.relative_attention_bias
        return table(mx.array(buckets)).transpose(2, 0, 1)[None]

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        bias = self.position_bias(x.shape[1]).astype(x.dtype)
        for block in self.block:
            x = block(x, mask, bias)
        return self.final_layer_norm(x)


class Model(Trunk):
    """The encoder: token ids -> final hidden states [B, L, D] (token types, if given, are ignored)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.shared = nn.Embedding(args.vocab_size, args.d_model)
        self.encoder = T5Stack(args)

    @property
    def n_positions(self) -> int:
        return self.args.n_positions

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        mask = sequence_mask(attention_mask, causal=True) if self.args.is_causal else padding_mask(attention_mask)
        return self.encoder(self.shared(input_ids), mask)

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """The encoder's keys: the token table as `shared.weight` (a checkpoint may store it as the encoder's tied
        embed_tokens instead), the decoder and the LM head of T5Model / T5ForConditionalGeneration dropped."""
        out = {k: v for k, v in weights.items()
               if k.startswith("encoder.") and not k.startswith("encoder.embed_tokens.")}
        table = weights.get("shared.weight", weights.get("encoder.embed_tokens.weight"))
        if table is not None:
            out["shared.weight"] = table
        return out
