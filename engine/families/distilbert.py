"""DistilBERT encoder (DistilBertModel, DistilBertForMaskedLM: the msmarco-distilbert / distiluse checkpoints);
DistilBertForMaskedLM's head too, for SPLADE sparse encoders (MaskedLM).

BERT's post-norm layers under DistilBERT's own names and config keys (dim, hidden_dim, n_layers, n_heads,
activation): no token types, no pooler, positions 0..L-1 from a table the checkpoint stores (learned, or the
sinusoidal one sinusoidal_pos_embds filled in), every LayerNorm at eps 1e-12 whatever the config says.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint
from engine.families.base import BaseModelArgs, LayerNorm, Trunk, activation, attention, padding_mask, split_heads

EPS = 1e-12  # transformers' DistilBERT fixes every LayerNorm's eps


@dataclass
class ModelArgs(BaseModelArgs):
    vocab_size: int
    dim: int = 768
    n_layers: int = 6
    n_heads: int = 12
    hidden_dim: int = 3072
    max_position_embeddings: int = 512
    activation: str = "gelu"

    @property
    def hidden_size(self) -> int:
        return self.dim


class Embeddings(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.dim)
        self.LayerNorm = LayerNorm(args.dim, eps=EPS)

    def __call__(self, input_ids: mx.array) -> mx.array:
        positions = mx.arange(input_ids.shape[1])[None]
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(positions))


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.q_lin = nn.Linear(args.dim, args.dim)
        self.k_lin = nn.Linear(args.dim, args.dim)
        self.v_lin = nn.Linear(args.dim, args.dim)
        self.out_lin = nn.Linear(args.dim, args.dim)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        q, k, v = (split_heads(proj(x), self.n_heads) for proj in (self.q_lin, self.k_lin, self.v_lin))
        return self.out_lin(attention(q, k, v, mask))


class FFN(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.lin1 = nn.Linear(args.dim, args.hidden_dim)
        self.lin2 = nn.Linear(args.hidden_dim, args.dim)
        self.act = activation(args.activation)

    def __call__(self, x: mx.array) -> mx.array:
        return self.lin2(self.act(self.lin1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = MultiHeadSelfAttention(args)
        self.sa_layer_norm = LayerNorm(args.dim, eps=EPS)
        self.ffn = FFN(args)
        self.output_layer_norm = LayerNorm(args.dim, eps=EPS)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        h = self.sa_layer_norm(self.attention(x, mask) + x)
        return self.output_layer_norm(self.ffn(h) + h)


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.layer = [TransformerBlock(args) for _ in range(args.n_layers)]

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class Model(Trunk):
    """The trunk: token ids -> final hidden states [B, L, D] (token types, if given, are ignored)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embeddings = Embeddings(args)
        self.transformer = Transformer(args)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.transformer(self.embeddings(input_ids), padding_mask(attention_mask))

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Trunk keys only: the `distilbert.` prefix dropped; the MLM head (vocab_transform, vocab_layer_norm,
        vocab_projector), classifier heads and the position_ids buffer dropped."""
        out = {}
        for key, value in weights.items():
            key = key.removeprefix("distilbert.")
            if key.startswith(("embeddings.", "transformer.")) and not key.endswith("position_ids"):
                out[key] = value
        return out


class MaskedLM(nn.Module):
    """DistilBertForMaskedLM: trunk, vocab_transform + activation + vocab_layer_norm, vocab_projector onto the
    vocabulary -> logits [B, L, vocab]; the projector's weight is tied to the word embeddings (stored or not)."""

    pools_itself = False

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.distilbert = Model(args)
        self.vocab_transform = nn.Linear(args.dim, args.dim)
        self.act = activation(args.activation)
        self.vocab_layer_norm = LayerNorm(args.dim, eps=EPS)
        self.vocab_projector = nn.Linear(args.dim, args.vocab_size)

    @property
    def trunk(self) -> nn.Module:
        return self.distilbert

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        hidden = self.distilbert(input_ids, attention_mask)
        return self.vocab_projector(self.vocab_layer_norm(self.act(self.vocab_transform(hidden))))

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        out = {f"distilbert.{k}": v for k, v in Model.sanitize(weights).items()}
        head = {k: v for k, v in weights.items() if k.startswith(("vocab_transform.", "vocab_layer_norm.",
                                                                  "vocab_projector."))}
        if "vocab_transform.weight" not in head:
            raise UnsupportedCheckpoint("no masked-LM head in the weights (vocab_transform, vocab_layer_norm, "
                                        "vocab_projector): SPLADE needs the checkpoint's MLM head, as "
                                        "DistilBertForMaskedLM saves it")
        head.setdefault("vocab_projector.weight", out["distilbert.embeddings.word_embeddings.weight"])
        return {**out, **head}
