"""MPNet encoder (MPNetModel, MPNetForMaskedLM: sentence-transformers' all-mpnet-base-v2 and its kin).

BERT's post-norm layers (engine/families/bert.py) with three differences: no token types; positions count real
tokens from the pad id + 1, as RoBERTa's (engine/families/xlm_roberta.py); and every layer adds one relative
position bias to its attention scores, looked up by T5's bidirectional buckets in a table the encoder owns and
computed once per pass. transformers' MPNet fixes both the pad id (1) and the bucket count (32, whatever
relative_attention_num_buckets says: only the table's first 32 rows are ever read); so does this file.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from engine.families import bert
from engine.families.base import LayerNorm, Trunk, attention, padding_mask, relative_position_buckets, split_heads
from engine.families.xlm_roberta import positions_after_pad

PAD = 1  # MPNetEmbeddings.padding_idx
BUCKETS, MAX_DISTANCE = 32, 128  # MPNetEncoder.compute_position_bias / relative_position_bucket defaults


@dataclass
class ModelArgs(bert.ModelArgs):  # BERT's fields and defaults (the token-type ones unused)
    relative_attention_num_buckets: int = 32


class MPNetEmbeddings(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.LayerNorm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array) -> mx.array:
        positions = positions_after_pad(input_ids, attention_mask, PAD)
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(positions))


class MPNetSelfAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.num_attention_heads
        self.q = nn.Linear(args.hidden_size, args.hidden_size)
        self.k = nn.Linear(args.hidden_size, args.hidden_size)
        self.v = nn.Linear(args.hidden_size, args.hidden_size)
        self.o = nn.Linear(args.hidden_size, args.hidden_size)

    def __call__(self, x: mx.array, mask: mx.array, position_bias: mx.array) -> mx.array:
        q, k, v = (split_heads(proj(x), self.n_heads) for proj in (self.q, self.k, self.v))
        return self.o(attention(q, k, v, mask, bias=position_bias))


class MPNetAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attn = MPNetSelfAttention(args)
        self.LayerNorm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, x: mx.array, mask: mx.array, position_bias: mx.array) -> mx.array:
        return self.LayerNorm(self.attn(x, mask, position_bias) + x)


class MPNetLayer(nn.Module):
    """Attention with the shared position bias, then BERT's feed-forward block (the same keys and math)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = MPNetAttention(args)
        self.intermediate = bert.BertIntermediate(args)
        self.output = bert.BertOutput(args)

    def __call__(self, x: mx.array, mask: mx.array, position_bias: mx.array) -> mx.array:
        h = self.attention(x, mask, position_bias)
        return self.output(self.intermediate(h), h)


class MPNetEncoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.layer = [MPNetLayer(args) for _ in range(args.num_hidden_layers)]
        self.relative_attention_bias = nn.Embedding(args.relative_attention_num_buckets, args.num_attention_heads)

    def position_bias(self, length: int) -> mx.array:
        """[1, H, L, L]: each head's bias for each (query, key) pair."""
        buckets = mx.array(relative_position_buckets(length, BUCKETS, MAX_DISTANCE))
        return self.relative_attention_bias(buckets).transpose(2, 0, 1)[None]

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        bias = self.position_bias(x.shape[1]).astype(x.dtype)
        for layer in self.layer:
            x = layer(x, mask, bias)
        return x


class Model(Trunk):
    """The trunk: token ids -> final hidden states [B, L, D] (token types, if given, are ignored: MPNet has none)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embeddings = MPNetEmbeddings(args)
        self.encoder = MPNetEncoder(args)

    @property
    def n_positions(self) -> int:
        # Positions start at PAD + 1: the table holds PAD + 1 fewer real tokens.
        return self.args.max_position_embeddings - PAD - 1

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.encoder(self.embeddings(input_ids, attention_mask), padding_mask(attention_mask))

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Trunk keys only: the `mpnet.` prefix dropped, then BERT's rules (lm_head.*, pooler.*, buffers dropped)."""
        return bert.Model.sanitize({k.removeprefix("mpnet."): v for k, v in weights.items()})
