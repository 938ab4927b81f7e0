"""Qwen3 decoder (Qwen3ForCausalLM), served as a generative reranker: only the hidden states and two
rows of the LM head are ever used, so no [B, L, vocab] logits tensor is built.

Rows arrive left-padded: every row ends at the last position, positions count real tokens only, and the
mask is causal + padding (a padding query still sees itself, so no row is fully masked).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint
from engine.families.base import BaseModelArgs


@dataclass
class ModelArgs(BaseModelArgs):
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float | None = None
    rope_parameters: dict[str, Any] | None = None
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"

    def __post_init__(self):
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        rope = self.rope_parameters or self.rope_scaling or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise UnsupportedCheckpoint(f"Qwen3 rope type {rope.get('rope_type', rope.get('type'))!r} is not supported")
        self.rope_theta = float(rope.get("rope_theta") or self.rope_theta or 1_000_000.0)
        if self.hidden_act != "silu":
            raise UnsupportedCheckpoint(f"Qwen3 hidden_act {self.hidden_act!r} is not supported (only 'silu')")


def rotate(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """Rotary embedding in the rotate-half layout; cos/sin [B, 1, L, Dh]."""
    half = x.shape[-1] // 2
    rotated = mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.q_proj = nn.Linear(args.hidden_size, self.n_heads * self.head_dim, bias=args.attention_bias)
        self.k_proj = nn.Linear(args.hidden_size, self.n_kv_heads * self.head_dim, bias=args.attention_bias)
        self.v_proj = nn.Linear(args.hidden_size, self.n_kv_heads * self.head_dim, bias=args.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, args.hidden_size, bias=args.attention_bias)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=args.rms_norm_eps)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=args.rms_norm_eps)

    def __call__(self, x: mx.array, mask: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        b, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(b, length, self.n_heads, -1)).transpose(0, 2, 1, 3)
        k = self.k_norm(self.k_proj(x).reshape(b, length, self.n_kv_heads, -1)).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(b, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(self.head_dim), mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, length, -1))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, x: mx.array, mask: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), mask, cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen3Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [TransformerBlock(args) for _ in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array) -> mx.array:
        """Left-padded ids and mask [B, L] -> final normed hidden states [B, L, D]."""
        real = attention_mask != 0
        positions = mx.maximum(mx.cumsum(real.astype(mx.int32), axis=1) - 1, 0)
        inv_freq = self.args.rope_theta ** (-mx.arange(0, self.args.head_dim, 2, dtype=mx.float32) / self.args.head_dim)
        angles = positions[..., None].astype(mx.float32) * inv_freq
        angles = mx.concatenate([angles, angles], axis=-1)[:, None]
        cos, sin = mx.cos(angles), mx.sin(angles)
        length = input_ids.shape[1]
        idx = mx.arange(length)
        causal = idx[None, :] <= idx[:, None]
        mask = (causal[None] & real[:, None, :]) | mx.eye(length, dtype=mx.bool_)[None]
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, mask[:, None], cos, sin)
        return self.norm(x)


class Model(nn.Module):
    """Qwen3ForCausalLM. The LM head is kept only to read the rows of the tokens a reranker compares."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Qwen3Model(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    @property
    def hidden_size(self) -> int:
        return self.args.hidden_size

    @property
    def n_positions(self) -> int:
        return self.args.max_position_embeddings

    def head_rows(self, token_ids: list[int]) -> mx.array:
        """The LM head's rows for these tokens, [len(token_ids), D]."""
        weight = self.model.embed_tokens.weight if self.args.tie_word_embeddings else self.lm_head.weight
        return weight[mx.array(token_ids)]

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.model(input_ids, attention_mask)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        out = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
        if self.args.tie_word_embeddings:
            out.pop("lm_head.weight", None)  # some tied exports still carry a copy
        return out
