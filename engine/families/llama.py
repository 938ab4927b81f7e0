"""Llama-style decoder backbone (LlamaForCausalLM / LlamaModel, Mistral, and LLM2Vec's bidirectional Llama).

Served as an embedder: the final normed hidden states of every token; pooling happens outside. The LM head
is never applied (and never loaded). Rows arrive right-padded; positions count real tokens, keys are real
tokens only, and every query sees itself, so no row is fully masked. Causal unless the checkpoint says it
was trained bidirectionally (`model_type: llama_bidirec`, `is_causal: false`, `use_bidirectional_attention`).

qwen2 and qwen3 reuse these blocks with their own ModelArgs (bias layout, q/k norms).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint
from engine.families.base import (
    SLIDING_ATTENTION,
    BaseModelArgs,
    Mask,
    Rotary,
    Trunk,
    activation,
    attention,
    checked_layer_types,
    is_bidirectional,
    rope_inverse_frequencies,
    rope_settings,
    sequence_mask,
    split_heads,
    take_rows,
    token_positions,
)

FULL, SLIDING = "full_attention", SLIDING_ATTENTION


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
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
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    is_causal: bool | None = None
    use_bidirectional_attention: bool | None = None
    # derived in __post_init__
    qkv_bias: bool = field(init=False)
    o_bias: bool = field(init=False)
    qk_norm: bool = field(init=False, default=False)
    causal: bool = field(init=False)
    rope: dict[str, Any] = field(init=False)

    default_rope_theta = 10_000.0

    @property
    def family(self) -> str:
        return self.model_type

    def __post_init__(self):
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedCheckpoint(f"{self.family}: num_attention_heads {self.num_attention_heads} is not a "
                                        f"multiple of num_key_value_heads {self.num_key_value_heads}")
        self.rope = rope_settings(self.family, self.rope_parameters, self.rope_scaling, self.rope_theta,
                                  self.default_rope_theta)
        self.qkv_bias = self.o_bias = self.attention_bias
        self.causal = not is_bidirectional(self.model_type, self.is_causal, self.use_bidirectional_attention)
        self.layer_types = checked_layer_types(self.family, self._layer_types(), self.num_hidden_layers,
                                               (FULL, SLIDING), self.sliding_window)

    def _layer_types(self) -> list[str]:
        """Llama attends fully everywhere (it has no sliding window); Mistral slides on every layer when
        sliding_window is set, as transformers' MistralModel does."""
        if self.model_type == "mistral" and self.sliding_window:
            return [SLIDING] * self.num_hidden_layers
        return [FULL] * self.num_hidden_layers

    def window(self, layer_type: str) -> int | None:
        return self.sliding_window if layer_type == SLIDING else None

    def rope_of(self, layer_type: str) -> dict[str, Any]:
        return self.rope


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads = args.num_attention_heads, args.num_key_value_heads
        self.q_proj = nn.Linear(args.hidden_size, self.n_heads * args.head_dim, bias=args.qkv_bias)
        self.k_proj = nn.Linear(args.hidden_size, self.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.v_proj = nn.Linear(args.hidden_size, self.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * args.head_dim, args.hidden_size, bias=args.o_bias)
        if args.qk_norm:  # Qwen3: RMSNorm over each head's query and key before the rotation
            self.q_norm = nn.RMSNorm(args.head_dim, eps=args.rms_norm_eps)
            self.k_norm = nn.RMSNorm(args.head_dim, eps=args.rms_norm_eps)

    def __call__(self, x: mx.array, mask: Mask, rope: Rotary, q_scale: mx.array | None = None,
                 rows: mx.array | None = None) -> mx.array:
        """q_scale [B, 1, L, 1]: each position's query multiplied after the rotation (Ministral 3's Llama 4
        attention scaling). rows: the output at these positions only ([B] int: [B, 1, D] out), keys from every
        token."""
        q = split_heads(self.q_proj(x if rows is None else take_rows(x, rows)), self.n_heads)
        k = split_heads(self.k_proj(x), self.n_kv_heads)
        v = split_heads(self.v_proj(x), self.n_kv_heads)
        if "q_norm" in self:
            q, k = self.q_norm(q), self.k_norm(k)
        if rows is not None:
            mask, q_rope = mask.at(rows), rope.at(rows)
            if q_scale is not None:
                q_scale = mx.take_along_axis(q_scale, rows.reshape(-1, 1, 1, 1).astype(mx.int32), axis=2)
        else:
            q_rope = rope
        q = q_rope(q)
        if q_scale is not None:
            q = q * q_scale
        return self.o_proj(attention(q, rope(k), v, mask))


class MLP(nn.Module):
    """Gated: down(act(gate(x)) * up(x)); SwiGLU for Llama and Qwen, GELU(tanh) for Gemma."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=args.mlp_bias)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=args.mlp_bias)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)
        self.act = activation(args.hidden_act)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, x: mx.array, mask: Mask, rope: Rotary, q_scale: mx.array | None = None,
                 rows: mx.array | None = None) -> mx.array:
        attended = self.self_attn(self.input_layernorm(x), mask, rope, q_scale, rows)
        h = (x if rows is None else take_rows(x, rows)) + attended
        return h + self.mlp(self.post_attention_layernorm(h))


class DecoderModel(nn.Module):
    """embed_tokens -> layers -> norm, as the checkpoint's `model.` keys name them."""

    block = TransformerBlock

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [self.block(args, kind) for kind in args.layer_types]
        self.norm = self.final_norm(args)

    def final_norm(self, args: ModelArgs) -> nn.Module:
        return nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def embed(self, input_ids: mx.array) -> mx.array:
        return self.embed_tokens(input_ids)

    def layer_masks(self, attention_mask: mx.array, kinds: set[str]) -> dict[str, Mask]:
        args = self.args
        return {kind: sequence_mask(attention_mask, args.causal, args.window(kind)) for kind in kinds}

    def position_tables(self, positions: mx.array, kind: str, attention_mask: mx.array) -> tuple:
        """What a layer of this kind takes after its mask, for token positions [B, L]: its rotary embedding."""
        args = self.args
        return (Rotary(positions, rope_inverse_frequencies(args.head_dim, args.rope_of(kind)), attention_mask),)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array, needed: mx.array | None = None) -> mx.array:
        """Padded ids and mask [B, L] (left or right padding) -> final normed hidden states [B, L, D] ([B, 1, D]
        at the positions `needed` [B] when given)."""
        return self.decode(self.embed(input_ids), attention_mask, needed)

    def decode(self, x: mx.array, attention_mask: mx.array, needed: mx.array | None = None) -> mx.array:
        """Input embeddings [B, L, D] (a vision-language family's, image features merged in) -> final normed
        hidden states. Each layer kind (full / sliding) gets its mask and its position tables (its rotary
        embedding), built once per pass. needed: one position per row [B] whose state is wanted (last-token
        pooling): the last layer computes only that position (its keys come from every token), and [B, 1, D]
        comes out."""
        args = self.args
        positions = token_positions(attention_mask)
        kinds = set(args.layer_types)
        tables = {kind: self.position_tables(positions, kind, attention_mask) for kind in kinds}
        masks = self.layer_masks(attention_mask, kinds)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            kind = layer.layer_type
            x = layer(x, masks[kind], *tables[kind], rows=needed if i == last else None)
        return self.norm(x)


class Model(Trunk):
    """The backbone under `model.`; a causal LM's head is dropped, an embedder never applies it."""

    backbone = DecoderModel

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = self.backbone(args)

    # the pipeline may pass `needed` (engine/compute/pipeline.py: last-token pooling)
    computes_needed_rows = True

    def __call__(self, input_ids: mx.array, attention_mask: mx.array, token_type_ids: mx.array | None = None,
                 needed: mx.array | None = None) -> mx.array:
        return self.model(input_ids, attention_mask, needed)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return backbone_weights(weights, keep_head=False)


def backbone_weights(weights: dict[str, mx.array], keep_head: bool) -> dict[str, mx.array]:
    """Checkpoint keys -> ours: a bare `*Model` export has no `model.` prefix; rotary buffers are dropped;
    `lm_head.*` is kept only when asked (a generative reranker reads two of its rows)."""
    out = {}
    for key, value in weights.items():
        if "rotary_emb." in key:
            continue
        if key.startswith("lm_head."):
            if keep_head:
                out[key] = value
            continue
        out[key if key.startswith("model.") else f"model.{key}"] = value
    return out
