"""Qwen3 decoder (Qwen3ForCausalLM / Qwen3Model): the Llama blocks with RMSNorm on each head's query and key.

Two uses. As an embedder (Qwen3-Embedding, or any Qwen3 with --embedding), `Model`: right-padded rows,
causal + padding mask, final normed hidden states (Qwen3-Embedding pools the last token, the <|endoftext|>
its tokenizer appends); the LM head is never loaded. As a generative reranker (Qwen3-Reranker), `CausalLM`:
left-padded rows so every row ends at the last position, and only two rows of the LM head are read, so no
[B, L, vocab] logits tensor is built. Positions count real tokens in both.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from engine.families import llama, qwen2
from engine.families.llama import Model  # noqa: F401  (the embedder entry point)


@dataclass
class ModelArgs(qwen2.ModelArgs):
    def __post_init__(self):
        super().__post_init__()
        self.qkv_bias = self.o_bias = self.attention_bias
        self.qk_norm = True


class CausalLM(llama.Model):
    """Qwen3ForCausalLM with its LM head, kept only to read the rows of the tokens a reranker compares."""

    def __init__(self, args: ModelArgs):
        super().__init__(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def head_rows(self, token_ids: list[int]) -> mx.array:
        """The LM head's rows for these tokens, [len(token_ids), D] (dequantized when the head is quantized)."""
        return head_rows(None if self.args.tie_word_embeddings else self.lm_head, self.model.embed_tokens, token_ids)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        # some tied exports still carry a copy of the head
        return llama.backbone_weights(weights, keep_head=not self.args.tie_word_embeddings)


def head_rows(head: nn.Module | None, embed_tokens: nn.Module, token_ids: list[int]) -> mx.array:
    """Rows of an LM head (None: tied to embed_tokens) for these tokens, dequantized when quantized."""
    ids = mx.array(token_ids)
    if head is None:
        return embed_tokens(ids)  # an embedding lookup is exactly the tied head's rows
    if isinstance(head, nn.QuantizedLinear):
        return mx.dequantize(head.weight[ids], head.scales[ids], head.biases[ids], head.group_size, head.bits)
    return head.weight[ids]
