"""BERT encoder (BertModel, BertForMaskedLM, BertForSequenceClassification checkpoints); BertForMaskedLM's
head too, for SPLADE sparse encoders (MaskedLM).

Attribute names follow the checkpoint's weight keys, so sanitize() only handles naming quirks.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint
from engine.families.base import (
    BaseModelArgs,
    LayerNorm,
    Trunk,
    activation,
    attention,
    padding_mask,
    split_heads,
    trunk_weights,
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
        self.LayerNorm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

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
        self.LayerNorm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

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
        self.LayerNorm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, x: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dense(x) + residual)


class BertLayer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = BertAttention(args)
        self.intermediate = BertIntermediate(args)
        self.output = BertOutput(args)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        h = self.attention(x, mask)
        return self.output(self.intermediate(h), h)


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
        """Trunk keys only: drop the `bert.` prefix, old gamma/beta names, buffers and task heads (cls.*: the MLM
        head; pooler.*; classifier.*)."""
        return trunk_weights(_renamed(weights), ("bert.",), ("embeddings.", "encoder."))


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


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.hidden_size)
        self.act = activation(args.hidden_act)
        self.LayerNorm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, x: mx.array) -> mx.array:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.transform = BertPredictionHeadTransform(args)
        self.decoder = nn.Linear(args.hidden_size, args.vocab_size)

    def __call__(self, x: mx.array) -> mx.array:
        return self.decoder(self.transform(x))


class BertOnlyMLMHead(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.predictions = BertLMPredictionHead(args)


class MaskedLM(nn.Module):
    """BertForMaskedLM: trunk, then the MLM head (dense + activation + LayerNorm, the decoder onto the
    vocabulary) -> logits [B, L, vocab]. The decoder's weight is tied to the word embeddings (a checkpoint
    stores it or not), its bias is cls.predictions.bias."""

    pools_itself = False

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.bert = Model(args)
        self.cls = BertOnlyMLMHead(args)

    @property
    def trunk(self) -> nn.Module:
        return self.bert

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.cls.predictions(self.bert(input_ids, attention_mask, token_type_ids))

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        weights = _renamed(weights)
        out = {f"bert.{k}": v for k, v in trunk_weights(weights, ("bert.",), ("embeddings.", "encoder.")).items()}
        head = {k: v for k, v in weights.items() if k.startswith("cls.predictions.")}
        if "cls.predictions.transform.dense.weight" not in head:
            raise UnsupportedCheckpoint("no masked-LM head in the weights (cls.predictions.*): SPLADE needs the "
                                        "checkpoint's MLM head, as BertForMaskedLM saves it")
        bias = head.pop("cls.predictions.bias", None)
        head.setdefault("cls.predictions.decoder.bias", bias)
        head.setdefault("cls.predictions.decoder.weight", out["bert.embeddings.word_embeddings.weight"])
        return {**out, **{k: v for k, v in head.items() if v is not None}}


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
