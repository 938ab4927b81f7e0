"""Gemma 3 text decoder (Gemma3TextModel / Gemma3ForCausalLM): EmbeddingGemma, or any Gemma 3 with --embedding.

Differences from the Llama blocks: token embeddings scaled by sqrt(hidden_size); RMSNorm scales by (1 + w);
RMSNorm on each head's query and key; attention scaled by query_pre_attn_scalar^-0.5; a GELU(tanh) gated MLP;
norms before and after both the attention and the MLP. Layers alternate sliding-window and full attention
(`layer_types`, else every `sliding_window_pattern`-th layer is full), each kind with its own rotary base.

EmbeddingGemma sets `use_bidirectional_attention`: full layers see every real token; sliding layers see real
tokens with |q - k| < sliding_window // 2 + 1, which is how transformers reads that config (the config
stores the full window; attention is exclusive on each side). Otherwise the mask is causal, and sliding
layers see q - k < sliding_window. Rows arrive right-padded; positions count real tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint
from engine.families import llama
from engine.families.base import (
    BaseModelArgs,
    Mask,
    Rotary,
    attention,
    checked_layer_types,
    rope_settings,
    split_heads,
    take_rows,
)
from engine.families.llama import FULL, SLIDING


@dataclass
class ModelArgs(BaseModelArgs):
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    num_key_value_heads: int = 1
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    hidden_activation: str = "gelu_pytorch_tanh"
    query_pre_attn_scalar: float = 256
    sliding_window: int | None = 4096
    layer_types: list[str] | None = None
    sliding_window_pattern: int = 6
    rope_theta: float | None = None
    rope_local_base_freq: float | None = None
    rope_scaling: dict[str, Any] | None = None
    rope_parameters: dict[str, Any] | None = None
    max_position_embeddings: int = 131_072
    attention_bias: bool = False
    attn_logit_softcapping: float | None = None
    use_bidirectional_attention: bool | None = False
    rope: dict[str, dict[str, Any]] = field(init=False)

    def __post_init__(self):
        if self.attn_logit_softcapping is not None:
            raise UnsupportedCheckpoint(f"Gemma 3 attn_logit_softcapping {self.attn_logit_softcapping} is not "
                                        "supported (Gemma 3 checkpoints have none)")
        if self.layer_types is None:
            pattern = self.sliding_window_pattern
            self.layer_types = [SLIDING if (i + 1) % pattern else FULL for i in range(self.num_hidden_layers)]
        self.layer_types = checked_layer_types("Gemma 3", self.layer_types, self.num_hidden_layers, (FULL, SLIDING),
                                               self.sliding_window)
        per_kind = self.rope_parameters if self.rope_parameters and FULL in self.rope_parameters else {}
        # rope_scaling (linear, on the larger Gemma 3 models) applies to the full-attention layers only
        self.rope = {
            FULL: rope_settings("Gemma 3", per_kind.get(FULL), self.rope_scaling, self.rope_theta, 1_000_000.0),
            SLIDING: rope_settings("Gemma 3", per_kind.get(SLIDING), None, self.rope_local_base_freq, 10_000.0),
        }

    @property
    def causal(self) -> bool:
        return not self.use_bidirectional_attention

    def rope_of(self, layer_type: str) -> dict[str, Any]:
        return self.rope[layer_type]

    @property
    def hidden_act(self) -> str:  # the gated MLP is llama's, with Gemma's activation and no biases
        return self.hidden_activation

    @property
    def mlp_bias(self) -> bool:
        return False

    def window(self, layer_type: str) -> int | None:
        if layer_type != SLIDING:
            return None
        return self.sliding_window // 2 + 1 if self.use_bidirectional_attention else self.sliding_window


class RMSNorm(nn.Module):
    """Gemma's RMSNorm: the weight is stored as an offset from 1."""

    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, 1.0 + self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads = args.num_attention_heads, args.num_key_value_heads
        self.scale = 1.0 / math.sqrt(args.query_pre_attn_scalar)
        self.q_proj = nn.Linear(args.hidden_size, self.n_heads * args.head_dim, bias=args.attention_bias)
        self.k_proj = nn.Linear(args.hidden_size, self.n_kv_heads * args.head_dim, bias=args.attention_bias)
        self.v_proj = nn.Linear(args.hidden_size, self.n_kv_heads * args.head_dim, bias=args.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * args.head_dim, args.hidden_size, bias=args.attention_bias)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps)
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps)

    def __call__(self, x: mx.array, mask: Mask, rope: Rotary, rows: mx.array | None = None) -> mx.array:
        """rows: the output at these positions only ([B] int: [B, 1, D] out), keys from every token."""
        q = self.q_norm(split_heads(self.q_proj(x if rows is None else take_rows(x, rows)), self.n_heads))
        k = self.k_norm(split_heads(self.k_proj(x), self.n_kv_heads))
        v = split_heads(self.v_proj(x), self.n_kv_heads)
        if rows is not None:
            mask, q_rope = mask.at(rows), rope.at(rows)
        else:
            q_rope = rope
        return self.o_proj(attention(q_rope(q), rope(k), v, mask, scale=self.scale))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.self_attn = Attention(args)
        self.mlp = llama.MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.pre_feedforward_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def __call__(self, x: mx.array, mask: Mask, rope: Rotary, rows: mx.array | None = None) -> mx.array:
        attended = self.self_attn(self.input_layernorm(x), mask, rope, rows=rows)
        h = (x if rows is None else take_rows(x, rows)) + self.post_attention_layernorm(attended)
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Gemma3TextModel(llama.DecoderModel):
    block = TransformerBlock

    def final_norm(self, args: ModelArgs) -> nn.Module:
        return RMSNorm(args.hidden_size, args.rms_norm_eps)

    def embed(self, input_ids: mx.array) -> mx.array:
        x = self.embed_tokens(input_ids)
        return x * mx.array(math.sqrt(self.args.hidden_size), dtype=x.dtype)


class Model(llama.Model):
    """The backbone under `model.`; a causal LM's tied head is never applied."""

    backbone = Gemma3TextModel
