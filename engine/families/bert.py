"""BERT encoder (BertModel, BertForMaskedLM, BertForSequenceClassification checkpoints).

Attribute names follow the checkpoint's weight keys, so sanitize() only handles naming quirks.
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
    part_streams,
    split_heads,
)


@dataclass
class ModelArgs(BaseModelArgs):
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"

    def __post_init__(self):
        if self.position_embedding_type != "absolute":
            raise UnsupportedCheckpoint(
                f"BERT position_embedding_type {self.position_embedding_type!r} is not supported (only 'absolute')")


class BertEmbeddings(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.token_type_embeddings = nn.Embedding(args.type_vocab_size, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, input_ids: mx.array, token_type_ids: mx.array, position_ids: mx.array) -> mx.array:
        x = (self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
             + self.token_type_embeddings(token_type_ids))
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.num_attention_heads
        self.query = nn.Linear(args.hidden_size, args.hidden_size)
        self.key = nn.Linear(args.hidden_size, args.hidden_size)
        self.value = nn.Linear(args.hidden_size, args.hidden_size)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        q, k, v = (split_heads(proj(x), self.n_heads) for proj in (self.query, self.key, self.value))
        return attention(q, k, v, mask)


class BertSelfOutput(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, x: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self = BertSelfAttention(args)
        self.output = BertSelfOutput(args)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.intermediate_size)
        self.act = activation(args.hidden_act)

    def __call__(self, x: mx.array) -> mx.array:
        return self.act(self.dense(x))


class BertOutput(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dense = nn.Linear(args.intermediate_size, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, x: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dense(x) + residual)


class LayerHalf(nn.Module):
    """Half of a layer's heads and half of its FFN, from the checkpoint's weights (BertLayer.split_halves).

    Its outputs are partial sums: the two halves' attention (or FFN) outputs add up to the layer's. out and down
    are stored input-major ([in, out]) so each half is a contiguous block of the checkpoint's matrix.
    """

    def __init__(self, qkv: nn.Linear, out: mx.array, up: nn.Linear, down: mx.array, n_heads: int, act):
        super().__init__()
        self.qkv, self.out, self.up, self.down = qkv, out, up, down
        self.n_heads = n_heads
        self.act = act

    def attend(self, x: mx.array, mask: mx.array) -> mx.array:
        b, length, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, length, 3, self.n_heads, -1).transpose(2, 0, 3, 1, 4)
        return attention(q, k, v, mask) @ self.out

    def feed_forward(self, h: mx.array) -> mx.array:
        return self.act(self.up(h)) @ self.down


class BertLayer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = BertAttention(args)
        self.intermediate = BertIntermediate(args)
        self.output = BertOutput(args)

    def split_halves(self) -> None:
        """Regroup the loaded weights into two halves (half the heads and half the FFN each), which the graph
        places on two streams when a pass computes alone (engine/threads.py spread): both cores work on every op
        of a single request. On one stream the halves run one after the other, with the same result bits.
        q/k/v become one matmul per half. Layers that cannot be halved (an odd head count, quantized weights)
        stay as they are."""
        attn = self.attention.self
        projections = (attn.query, attn.key, attn.value, self.attention.output.dense, self.intermediate.dense,
                       self.output.dense)
        d, inner = attn.query.weight.shape[0], self.intermediate.dense.weight.shape[0]
        if attn.n_heads % 2 or inner % 2 or any(type(p) is not nn.Linear for p in projections):
            return
        halves = []
        for i in range(2):
            rows, inner_rows = slice(i * d // 2, (i + 1) * d // 2), slice(i * inner // 2, (i + 1) * inner // 2)
            qkv = nn.Linear(d, 3 * d // 2)
            qkv.weight = mx.concatenate([p.weight[rows] for p in (attn.query, attn.key, attn.value)])
            qkv.bias = mx.concatenate([p.bias[rows] for p in (attn.query, attn.key, attn.value)])
            up = nn.Linear(d, inner // 2)
            up.weight, up.bias = self.intermediate.dense.weight[inner_rows], self.intermediate.dense.bias[inner_rows]
            halves.append(LayerHalf(qkv, mx.contiguous(self.attention.output.dense.weight[:, rows].T), up,
                                    mx.contiguous(self.output.dense.weight[:, inner_rows].T), attn.n_heads // 2,
                                    self.intermediate.act))
        mx.eval(halves[0].parameters(), halves[1].parameters())
        self.halves = halves
        self.attention_bias, self.output_bias = self.attention.output.dense.bias, self.output.dense.bias
        # the halves replace these (the LayerNorms stay): the weights are held once
        del self.attention["self"], self.attention.output["dense"], self["intermediate"], self.output["dense"]

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        if "halves" not in self:
            h = self.attention(x, mask)
            return self.output(self.intermediate(h), h)
        streams = part_streams(2)
        parts = []
        for half, stream in zip(self.halves, streams):
            with mx.stream(stream):
                parts.append(half.attend(x, mask))
        h = self.attention.output.LayerNorm(parts[0] + parts[1] + self.attention_bias + x)
        parts = []
        for half, stream in zip(self.halves, streams):
            with mx.stream(stream):
                parts.append(half.feed_forward(h))
        return self.output.LayerNorm(parts[0] + parts[1] + self.output_bias + h)


class BertEncoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.layer = [BertLayer(args) for _ in range(args.num_hidden_layers)]

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertPooler(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.hidden_size)

    def __call__(self, hidden: mx.array) -> mx.array:
        return mx.tanh(self.dense(hidden[:, 0]))


class Model(Trunk):
    """The trunk: token ids -> final hidden states [B, L, D]. The pooler only exists for classifiers."""

    def __init__(self, args: ModelArgs, add_pooler: bool = False):
        super().__init__()
        self.args = args
        self.embeddings = BertEmbeddings(args)
        self.encoder = BertEncoder(args)
        if add_pooler:
            self.pooler = BertPooler(args)

    def position_ids(self, input_ids: mx.array, attention_mask: mx.array) -> mx.array:
        return mx.broadcast_to(mx.arange(input_ids.shape[1]), input_ids.shape)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        if token_type_ids is None:
            token_type_ids = mx.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids, self.position_ids(input_ids, attention_mask))
        return self.encoder(x, padding_mask(attention_mask))

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Trunk keys only: drop the `bert.` prefix, old gamma/beta names, buffers and task heads."""
        out = {}
        for key, value in _renamed(weights).items():
            if key.startswith("bert."):
                key = key[len("bert."):]
            if key.startswith(("embeddings.", "encoder.")):
                out[key] = value  # cls.* (MLM head), pooler.*, classifier.*: not part of the trunk
        return out


class SequenceClassifier(nn.Module):
    """BertForSequenceClassification: trunk, pooler (dense + tanh on [CLS]), classifier -> [B, labels].

    Families with the same head over another trunk subclass it, naming their trunk's key and class.
    """

    trunk_key = "bert"
    trunk_class = Model

    def __init__(self, args, num_labels: int):
        super().__init__()
        self[self.trunk_key] = self.trunk_class(args, add_pooler=True)
        self.classifier = nn.Linear(args.hidden_size, num_labels)

    @property
    def trunk(self) -> nn.Module:
        return self[self.trunk_key]

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.classifier(self.trunk.pooler(self.trunk(input_ids, attention_mask, token_type_ids)))

    @staticmethod
    def label_count(weights: dict[str, mx.array]) -> int:
        return int(weights["classifier.weight"].shape[0])

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return {k: v for k, v in _renamed(weights).items() if k.startswith(("bert.", "classifier."))}


def _renamed(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Old TF-era LayerNorm names (gamma/beta) -> weight/bias; the unused position_ids buffer dropped."""
    out = {}
    for key, value in weights.items():
        if key.endswith("position_ids"):
            continue
        if key.endswith(".gamma"):
            key = key[: -len("gamma")] + "weight"
        elif key.endswith(".beta"):
            key = key[: -len("beta")] + "bias"
        out[key] = value
    return out
