"""NeoBERT (chandar-lab/NeoBERT: `NeoBERT`, `NeoBERTLMHead`, `NeoBERTForSequenceClassification`): a pre-norm
encoder with RMSNorm, interleaved rotary positions on whole heads, a fused qkv projection and a SwiGLU
feed-forward, no biases, and a final RMSNorm.

There is no transformers class (the checkpoint ships its own remote code), so this file follows the graph
llama.cpp runs on a `neo-bert` GGUF (src/models/neo-bert.cpp at 3f545bec): `qkv`'s output read as [q | k | v],
RoPE in ggml's NORM mode (consecutive pairs: mx.fast.rope's traditional layout) on positions 0..L-1, `w12`'s output
as [gate | up] (silu(first half) * second half), then `w3`. Module names are the checkpoint's weight keys.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from engine.families.base import BaseModelArgs, Trunk, attention, padding_mask, split_heads


@dataclass
class ModelArgs(BaseModelArgs):
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    ffn_size: int  # the SwiGLU's width (w12 holds twice as many rows)
    max_position_embeddings: int = 4096
    norm_eps: float = 1e-6
    rope_theta: float = 10_000.0


class NeoBertAttentionBlock(nn.Module):
    """One encoder layer: x + wo(attn(norm(x))), then + w3(swiglu(w12(norm(.))))."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        d = args.hidden_size
        self.n_heads = args.num_attention_heads
        self.head_dim = d // self.n_heads
        self.base = float(args.rope_theta)
        self.attention_norm = nn.RMSNorm(d, eps=args.norm_eps)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.ffn_norm = nn.RMSNorm(d, eps=args.norm_eps)
        self.ffn = NeoBertSwiGLU(args)

    def __call__(self, x: mx.array, mask) -> mx.array:
        q, k, v = (split_heads(t, self.n_heads) for t in mx.split(self.qkv(self.attention_norm(x)), 3, axis=-1))
        # Positions 0..L-1 on every row: rows are right-padded, so real tokens sit where llama.cpp puts them.
        q, k = (mx.fast.rope(t, self.head_dim, traditional=True, base=self.base, scale=1.0, offset=0) for t in (q, k))
        h = x + self.wo(attention(q, k, v, mask))
        return h + self.ffn(self.ffn_norm(h))


class NeoBertSwiGLU(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.ffn_size = args.ffn_size
        self.w12 = nn.Linear(args.hidden_size, 2 * args.ffn_size, bias=False)
        self.w3 = nn.Linear(args.ffn_size, args.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        gate, up = mx.split(self.w12(x), 2, axis=-1)
        return self.w3(nn.silu(gate) * up)


class Model(Trunk):
    """The trunk: token ids -> final hidden states [B, L, D] (after the last RMSNorm)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.encoder = nn.Embedding(args.vocab_size, args.hidden_size)
        self.transformer_encoder = [NeoBertAttentionBlock(args) for _ in range(args.num_hidden_layers)]
        self.layer_norm = nn.RMSNorm(args.hidden_size, eps=args.norm_eps)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        x = self.encoder(input_ids)
        mask = padding_mask(attention_mask)
        for layer in self.transformer_encoder:
            x = layer(x, mask)
        return self.layer_norm(x)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return weights
