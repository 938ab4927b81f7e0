"""JinaBERT v2 (jina-embeddings-v2-base-en / -de / -code, jina-reranker-v1-*): BERT's post-norm blocks with
symmetric ALiBi biases instead of position embeddings and a gated-GELU feed-forward.

There is no transformers class (the checkpoints ship their own remote code), so this file follows the graph
llama.cpp runs on a `jina-bert-v2` GGUF (src/models/bert.cpp at 3f545bec), which is what its files can be checked
against:

- embeddings: word + the first token-type row (llama.cpp serves every token as type 0), LayerNorm;
- attention: q/k/v with biases, optional LayerNorms of the whole q and k rows (the -de / -code variants), scores
  plus `-slope_h * |i - j|` with ggml's ALiBi slopes for max_bias 8 (soft_max_ext), then dense + residual +
  LayerNorm; the -code variant's second norm (`layer_norm_1`) adds the block input once more and normalizes again;
- feed-forward: `up_layer` holding [gate; up] rows (GEGLU: gelu(first half) * second half), or a separate
  `gate_layer` (gelu(gate) * up, older conversions), or a plain GELU on `up_layer` (the non-gated "original"
  variant), then `wo` + residual + LayerNorm.

GELU is the erf form (the checkpoints' nn.GELU()); llama.cpp computes its tanh approximation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.families.base import BaseModelArgs, LayerNorm, Trunk, attention, gelu_erf, padding_mask, split_heads
from engine.families.bert import BertSelfOutput
from engine.families.kernels import BLOCKWISE_FROM

ALIBI_BLOCK_ROWS = 256  # query rows per attention pass on inputs of BLOCKWISE_FROM tokens or more


@dataclass
class ModelArgs(BaseModelArgs):
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 8192  # ALiBi has no table: llama.cpp's context_length
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    alibi_max_bias: float = 8.0  # llama.cpp's f_max_alibi_bias for jina-bert-v2
    attention_bias: bool = True
    qk_norm: bool = False  # attention.self.layer_norm_q / layer_norm_k
    second_attention_norm: bool = False  # layer_norm_1 (jina-v2-code)
    up_rows: int | None = None  # rows of mlp.up_layer: 2 * intermediate_size (GEGLU) or intermediate_size
    separate_gate: bool = False  # mlp.gate_layer present
    up_bias: bool = False


def alibi_slopes(n_heads: int, max_bias: float) -> np.ndarray:
    """ggml's per-head ALiBi slopes (ggml_soft_max_ext with max_bias), in float32 as ggml computes them."""
    n_log2 = 1 << int(math.floor(math.log2(n_heads)))
    m0 = np.float32(2.0) ** np.float32(-max_bias / n_log2)
    m1 = np.float32(2.0) ** np.float32(-(max_bias / 2.0) / n_log2)
    return np.array([m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1) for h in range(n_heads)],
                    dtype=np.float32)


class Alibi:
    """One pass's ALiBi biases: -slope_h * |i - j| (llama.cpp's mask holds -|p0 - p1|, scaled per head by
    soft_max_ext), for a band of query rows. The whole [L, L] bias of a short input is built once and shared by
    every layer; a long input's bands are built as each is used (kept, they would add up to the quadratic
    whole)."""

    def __init__(self, slopes: np.ndarray, dtype: mx.Dtype):
        self.slopes, self.dtype = mx.array(slopes)[:, None, None], dtype
        self._whole: mx.array | None = None

    def rows(self, q0: int, q1: int, length: int) -> mx.array:
        """[1, H, q1 - q0, length]."""
        whole = q0 == 0 and q1 == length
        if whole and self._whole is not None:
            return self._whole
        distance = mx.abs(mx.arange(q0, q1)[:, None] - mx.arange(length)[None, :]).astype(mx.float32)
        band = (-self.slopes * distance)[None].astype(self.dtype)
        if whole:
            self._whole = band
        return band


class JinaBertEmbeddings(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.token_type_embeddings = nn.Embedding(args.type_vocab_size, args.hidden_size)
        self.LayerNorm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, input_ids: mx.array, token_type_ids: mx.array) -> mx.array:
        return self.LayerNorm(self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids))


class JinaBertSelfAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.num_attention_heads
        d = args.hidden_size
        self.query = nn.Linear(d, d, bias=args.attention_bias)
        self.key = nn.Linear(d, d, bias=args.attention_bias)
        self.value = nn.Linear(d, d, bias=args.attention_bias)
        if args.qk_norm:
            self.layer_norm_q = LayerNorm(d, eps=args.layer_norm_eps)
            self.layer_norm_k = LayerNorm(d, eps=args.layer_norm_eps)

    def __call__(self, x: mx.array, mask, alibi: Alibi) -> mx.array:
        q, k, v = self.query(x), self.key(x), self.value(x)
        if "layer_norm_q" in self:
            q, k = self.layer_norm_q(q), self.layer_norm_k(k)
        q, k, v = (split_heads(t, self.n_heads) for t in (q, k, v))
        length = q.shape[2]
        if length < BLOCKWISE_FROM:
            return attention(q, k, v, mask, bias=alibi.rows(0, length, length))
        # A bias makes each pass dense: on a long input, one band of query rows at a time, chained so MLX does
        # not schedule them all at once (memory linear in the length, as the engine's memory law assumes).
        outs: list[mx.array] = []
        for q0 in range(0, length, ALIBI_BLOCK_ROWS):
            q1 = min(q0 + ALIBI_BLOCK_ROWS, length)
            block = q[:, :, q0:q1]
            if outs:
                block = mx.depends(block, outs[-1])
            outs.append(attention(block, k, v, mask, bias=alibi.rows(q0, q1, length)))
        return mx.concatenate(outs, axis=1)


class JinaBertAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self = JinaBertSelfAttention(args)
        self.output = BertSelfOutput(args)  # dense, + residual, LayerNorm


class JinaBertMLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d, ff = args.hidden_size, args.intermediate_size
        self.intermediate_size = ff
        self.up_layer = nn.Linear(d, args.up_rows or 2 * ff, bias=args.up_bias)
        if args.separate_gate:
            self.gate_layer = nn.Linear(d, ff, bias=False)
        self.wo = nn.Linear(ff, d)
        self.layernorm = LayerNorm(d, eps=args.layer_norm_eps)

    def __call__(self, x: mx.array) -> mx.array:
        up = self.up_layer(x)
        if "gate_layer" in self:
            h = gelu_erf(self.gate_layer(x)) * up
        elif up.shape[-1] == 2 * self.intermediate_size:
            h = gelu_erf(up[..., : self.intermediate_size]) * up[..., self.intermediate_size:]
        else:
            h = gelu_erf(up)
        return self.layernorm(self.wo(h) + x)


class JinaBertLayer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = JinaBertAttention(args)
        if args.second_attention_norm:
            self.layer_norm_1 = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.mlp = JinaBertMLP(args)

    def __call__(self, x: mx.array, mask, alibi: Alibi) -> mx.array:
        h = self.attention.output(self.attention.self(x, mask, alibi), x)
        if "layer_norm_1" in self:
            h = self.layer_norm_1(h + x)
        return self.mlp(h)


class JinaBertEncoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.layer = [JinaBertLayer(args) for _ in range(args.num_hidden_layers)]


class Model(Trunk):
    """The trunk: token ids -> final hidden states [B, L, D]."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embeddings = JinaBertEmbeddings(args)
        self.encoder = JinaBertEncoder(args)
        self._slopes = alibi_slopes(args.num_attention_heads, args.alibi_max_bias)  # numpy: not a parameter

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        if token_type_ids is None:
            token_type_ids = mx.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        mask = padding_mask(attention_mask)
        alibi = Alibi(self._slopes, x.dtype)
        for layer in self.encoder.layer:
            x = layer(x, mask, alibi)
        return x

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return weights
