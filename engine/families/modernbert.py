"""ModernBERT encoder (ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification).

Pre-norm layers with rotary positions and no position table. Every global_attn_every_n_layers-th layer
(from layer 0) attends globally with global_rope_theta; the others attend within local_attention // 2 tokens
on each side with local_rope_theta. Attribute names follow the checkpoint's weight keys.
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
    LayerNorm,
    Mask,
    Trunk,
    activation,
    attention,
    checked_layer_types,
    padding_mask,
    split_heads,
    trunk_weights,
)

GLOBAL, LOCAL = "full_attention", SLIDING_ATTENTION


@dataclass
class ModelArgs(BaseModelArgs):
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    pad_token_id: int = 50283
    local_attention: int = 128
    global_attn_every_n_layers: int = 3
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    # transformers >= 5 also writes these; when present they take precedence over the scalars above.
    layer_types: list[str] | None = None
    rope_parameters: dict[str, Any] | None = None
    rope_scaling: dict[str, Any] | None = None
    classifier_pooling: str = "cls"
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    rope_thetas: dict[str, float] = field(init=False)

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise UnsupportedCheckpoint(f"ModernBERT hidden_size {self.hidden_size} is not a multiple of "
                                        f"num_attention_heads {self.num_attention_heads}")
        if self.layer_types is None:
            every = self.global_attn_every_n_layers
            self.layer_types = [LOCAL if i % every else GLOBAL for i in range(self.num_hidden_layers)]
        self.layer_types = checked_layer_types("ModernBERT", self.layer_types, self.num_hidden_layers, (GLOBAL, LOCAL),
                                               self.local_attention)
        if self.rope_scaling:
            raise UnsupportedCheckpoint(f"ModernBERT rope_scaling {self.rope_scaling!r} is not supported")
        params = self.rope_parameters or {}
        defaults = {GLOBAL: self.global_rope_theta, LOCAL: self.local_rope_theta}
        self.rope_thetas = {}
        for kind, theta in defaults.items():
            p = params.get(kind) or {}
            if p.get("rope_type", "default") != "default":
                raise UnsupportedCheckpoint(f"ModernBERT rope_type {p['rope_type']!r} is not supported "
                                            "(only 'default')")
            self.rope_thetas[kind] = float(p.get("rope_theta", theta))
        if self.classifier_pooling not in ("cls", "mean"):
            raise UnsupportedCheckpoint(f"ModernBERT classifier_pooling {self.classifier_pooling!r} is not "
                                        "supported (cls, mean)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def window(self) -> int:
        """Keys within this distance (inclusive) of the query, on each side, in a local layer."""
        return self.local_attention // 2


def _layer_norm(args: ModelArgs) -> LayerNorm:
    return LayerNorm(args.hidden_size, eps=args.norm_eps, bias=args.norm_bias)


class ModernBertEmbeddings(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.norm = _layer_norm(args)

    def __call__(self, input_ids: mx.array) -> mx.array:
        return self.norm(self.tok_embeddings(input_ids))


class ModernBertAttention(nn.Module):
    def __init__(self, args: ModelArgs, rope_theta: float):
        super().__init__()
        self.n_heads = args.num_attention_heads
        self.head_dim = args.head_dim
        self.rope_theta = rope_theta
        self.Wqkv = nn.Linear(args.hidden_size, 3 * args.hidden_size, bias=args.attention_bias)
        self.Wo = nn.Linear(args.hidden_size, args.hidden_size, bias=args.attention_bias)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        # The fused projection is split after the matmul (a quantized Wqkv loads unchanged).
        q, k, v = (split_heads(t, self.n_heads) for t in mx.split(self.Wqkv(x), 3, axis=-1))
        q = mx.fast.rope(q, self.head_dim, traditional=False, base=self.rope_theta, scale=1.0, offset=0)
        k = mx.fast.rope(k, self.head_dim, traditional=False, base=self.rope_theta, scale=1.0, offset=0)
        return self.Wo(attention(q, k, v, mask))


class ModernBertMLP(nn.Module):
    """GeGLU: Wi makes [input | gate], act(input) * gate goes through Wo."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.Wi = nn.Linear(args.hidden_size, 2 * args.intermediate_size, bias=args.mlp_bias)
        self.act = activation(args.hidden_activation)
        self.Wo = nn.Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)

    def __call__(self, x: mx.array) -> mx.array:
        inp, gate = mx.split(self.Wi(x), 2, axis=-1)
        return self.Wo(self.act(inp) * gate)


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, index: int):
        super().__init__()
        self.attention_type = args.layer_types[index]
        # Layer 0 has no attn_norm in the checkpoint (the embeddings' norm precedes it); any other layer must.
        self.attn_norm = nn.Identity() if index == 0 else _layer_norm(args)
        self.attn = ModernBertAttention(args, args.rope_thetas[self.attention_type])
        self.mlp_norm = _layer_norm(args)
        self.mlp = ModernBertMLP(args)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        x = x + self.attn(self.attn_norm(x), mask)
        return x + self.mlp(self.mlp_norm(x))


class Model(Trunk):
    """The trunk: token ids -> final hidden states [B, L, D]."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embeddings = ModernBertEmbeddings(args)
        self.layers = [ModernBertEncoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.final_norm = _layer_norm(args)

    def masks(self, attention_mask: mx.array) -> dict[str, Mask]:
        """The mask per layer kind. Global: the padding mask. Local: padding and |q - k| <= window; every query
        also sees itself, so a padding row beyond the window of any real token is never fully masked (NaN).
        A real query always sees itself anyway, so its row is unchanged."""
        keys = padding_mask(attention_mask)
        local = Mask(keys.keys, window=self.args.window + 1, diagonal=True, source=attention_mask)
        return {GLOBAL: keys, LOCAL: local}

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        masks = self.masks(attention_mask)
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, masks[layer.attention_type])
        return self.final_norm(x)

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Trunk keys only: the `model.` prefix dropped; head.*, decoder.* and classifier.* are not the trunk."""
        return trunk_weights(weights, ("model.",), ("embeddings.", "layers.", "final_norm."))


class ModernBertPredictionHead(nn.Module):
    """dense, classifier_activation, norm."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.hidden_size, bias=args.classifier_bias)
        self.act = activation(args.classifier_activation)
        self.norm = _layer_norm(args)

    def __call__(self, x: mx.array) -> mx.array:
        return self.norm(self.act(self.dense(x)))


class SequenceClassifier(nn.Module):
    """ModernBertForSequenceClassification: trunk, classifier_pooling (cls | masked mean), head, classifier."""

    def __init__(self, args: ModelArgs, num_labels: int):
        super().__init__()
        self.pooling = args.classifier_pooling
        self.model = Model(args)
        self.head = ModernBertPredictionHead(args)
        self.classifier = nn.Linear(args.hidden_size, num_labels)

    @property
    def trunk(self) -> Model:
        return self.model

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        hidden = self.model(input_ids, attention_mask)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            m = attention_mask.astype(hidden.dtype)[..., None]
            pooled = (hidden * m).sum(axis=1) / mx.maximum(m.sum(axis=1), 1)
        return self.classifier(self.head(pooled))

    @staticmethod
    def label_count(weights: dict[str, mx.array]) -> int:
        return int(weights["classifier.weight"].shape[0])

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return {k: v for k, v in weights.items() if k.startswith(("model.", "head.", "classifier."))}
