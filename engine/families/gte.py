"""GTE encoder (Alibaba-NLP's "new" architecture: gte-multilingual-base, gte-base/large-en-v1.5,
gte-multilingual-reranker-base; transformers >= 5 calls it `gte`).

A post-norm BERT without a position table: rotary positions (optionally NTK-scaled), a fused qkv_proj, a
gated MLP (up_gate_proj = [up; gate], act(gate) * up) and LayerNorms after each block. The hub's config.json
says model_type "new" with rope_theta / rope_scaling; transformers writes model_type "gte" with
rope_parameters, over the same weight keys. Padded rows run as they are (the reference's `unpad_inputs` is a
speed path that computes the same values). Attribute names follow the checkpoint's weight keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint
from engine.families.base import (BaseModelArgs, LayerNorm, Trunk, activation, attention, padding_mask,
                                  split_heads, trunk_weights, without_prefix)
from engine.families import bert

# Where the trunk sits in the task heads: NewFor* checkpoints use `new.`, transformers' GteFor* `gte.`.
_TRUNK_PREFIXES = ("new.", "gte.")


@dataclass
class ModelArgs(BaseModelArgs):
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    max_position_embeddings: int = 8192
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-12
    layer_norm_type: str = "layer_norm"
    position_embedding_type: str = "rope"
    rope_theta: float = 160_000.0
    rope_scaling: dict[str, Any] | None = None
    rope_parameters: dict[str, Any] | None = None  # transformers >= 5; takes precedence over rope_theta
    logn_attention_scale: bool = False
    rope_base: float = field(init=False)
    rope_position_scale: float = field(init=False)

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise UnsupportedCheckpoint(f"GTE hidden_size {self.hidden_size} is not a multiple of "
                                        f"num_attention_heads {self.num_attention_heads}")
        refused = []
        if self.position_embedding_type != "rope":
            refused.append(f"position_embedding_type {self.position_embedding_type!r}")
        if self.layer_norm_type != "layer_norm":
            refused.append(f"layer_norm_type {self.layer_norm_type!r}")
        if self.logn_attention_scale:
            refused.append("logn_attention_scale")
        if refused:
            raise UnsupportedCheckpoint(f"GTE {', '.join(refused)} is not supported (the published checkpoints "
                                        f"use rope, layer_norm and no logn scaling)")
        self.rope_base, self.rope_position_scale = self._rope()

    def _rope(self) -> tuple[float, float]:
        """(base, position scale) for mx.fast.rope.

        Fixed NTK scaling (the hub's rope_scaling {"type": "ntk", "factor": f}) computes
        inv_freq_i = (theta * f) ** (-2i / d) / f ** (2 / d): rope with base theta * f on positions scaled
        by f ** (-2 / d).
        """
        if self.rope_parameters is not None:
            if self.rope_parameters.get("rope_type", "default") != "default":
                raise UnsupportedCheckpoint(f"GTE rope_type {self.rope_parameters['rope_type']!r} is not supported "
                                            "(only 'default')")
            return float(self.rope_parameters.get("rope_theta", self.rope_theta)), 1.0
        if not self.rope_scaling:
            return float(self.rope_theta), 1.0
        kind, factor = self.rope_scaling.get("type"), float(self.rope_scaling.get("factor", 1.0))
        if kind != "ntk" or self.rope_scaling.get("mixed_b") is not None:
            raise UnsupportedCheckpoint(f"GTE rope_scaling {self.rope_scaling!r} is not supported "
                                        "(only fixed 'ntk' scaling without mixed_b)")
        if factor <= 1.0:  # the reference only rescales when the scaled length exceeds the table
            return float(self.rope_theta), 1.0
        return float(self.rope_theta) * factor, factor ** (-2.0 / self.head_dim)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class NewEmbeddings(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        if args.type_vocab_size > 0:  # gte-base-en-v1.5 has none
            self.token_type_embeddings = nn.Embedding(args.type_vocab_size, args.hidden_size)
        self.LayerNorm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, input_ids: mx.array, token_type_ids: mx.array) -> mx.array:
        x = self.word_embeddings(input_ids)
        if "token_type_embeddings" in self:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class NewAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.num_attention_heads
        self.head_dim = args.head_dim
        self.base, self.position_scale = args.rope_base, args.rope_position_scale
        self.qkv_proj = nn.Linear(args.hidden_size, 3 * args.hidden_size)
        self.o_proj = nn.Linear(args.hidden_size, args.hidden_size)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        q, k, v = (split_heads(t, self.n_heads) for t in mx.split(self.qkv_proj(x), 3, axis=-1))
        # Positions 0..L-1 on every row: rows are right-padded, so real tokens sit where the reference puts them.
        q, k = (mx.fast.rope(t, self.head_dim, traditional=False, base=self.base, scale=self.position_scale,
                             offset=0) for t in (q, k))
        return self.o_proj(attention(q, k, v, mask))


class NewGatedMLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.up_gate_proj = nn.Linear(args.hidden_size, 2 * args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size)
        self.act = activation(args.hidden_act)

    def __call__(self, x: mx.array) -> mx.array:
        up, gate = mx.split(self.up_gate_proj(x), 2, axis=-1)
        return self.down_proj(self.act(gate) * up)


class NewLayer(nn.Module):
    """Post-norm: attn_ln(x + attention(x)), then mlp_ln(h + mlp(h))."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = NewAttention(args)
        self.mlp = NewGatedMLP(args)
        self.attn_ln = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.mlp_ln = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        h = self.attn_ln(x + self.attention(x, mask))
        return self.mlp_ln(h + self.mlp(h))


class NewEncoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.layer = [NewLayer(args) for _ in range(args.num_hidden_layers)]

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class Model(Trunk):
    """The trunk: token ids -> final hidden states [B, L, D]. The pooler only exists for classifiers."""

    def __init__(self, args: ModelArgs, add_pooler: bool = False):
        super().__init__()
        self.args = args
        self.embeddings = NewEmbeddings(args)
        self.encoder = NewEncoder(args)
        if add_pooler:
            self.pooler = bert.BertPooler(args)  # the same [CLS] dense + tanh

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        if token_type_ids is None:
            token_type_ids = mx.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        return self.encoder(x, padding_mask(attention_mask))

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Trunk keys only: a task head's `new.`/`gte.` prefix dropped; heads, poolers and buffers left out."""
        tensors = {k: v for k, v in _packed(weights).items() if not k.endswith("position_ids")}
        return trunk_weights(tensors, _TRUNK_PREFIXES, ("embeddings.", "encoder."))


class SequenceClassifier(bert.SequenceClassifier):
    """NewForSequenceClassification (gte-multilingual-reranker-base): BERT's head (pooler, classifier) on the
    GTE trunk, stored under `new.`."""

    trunk_key = "new"
    trunk_class = Model

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        out = {}
        for key, value in _packed(weights).items():
            if key.startswith(_TRUNK_PREFIXES) and not key.endswith("position_ids"):
                out["new." + without_prefix(key, _TRUNK_PREFIXES)] = value
            elif key.startswith("classifier."):
                out[key] = value
        return out


def _packed(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Checkpoints saved with pack_qkv false have q_proj/k_proj/v_proj: fuse them into qkv_proj."""
    out = dict(weights)
    for key in [k for k in weights if ".attention.q_proj." in k]:
        parts = [out.pop(key.replace(".q_proj.", f".{name}.")) for name in ("q_proj", "k_proj", "v_proj")]
        out[key.replace(".q_proj.", ".qkv_proj.")] = mx.concatenate(parts, axis=0)
    return out
