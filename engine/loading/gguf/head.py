"""llama.cpp's rank head (llama-graph.cpp build_pooling, case RANK), for reranker GGUFs.

The file keeps only what llama.cpp computes: one pooled token (ModernBERT: the mean of all tokens), then `cls`
(dense + tanh; ModernBERT: dense + GELU in ggml's tanh approximation, then the `cls.norm` LayerNorm) when present,
then `cls.output` (jina-bert-v2 rerankers: `cls` [1, n_embd] is the classifier, tanh'd, and there is no
`cls.output`). BERT conversions drop the checkpoint's pooler and serve every token type as 0, so their scores
are llama-server's, not the original checkpoint's. Qwen3 rerankers store the yes/no rows in `cls.output`
and llama.cpp takes softmax(...)[0] = P(yes).
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from collections.abc import Callable

from engine.compute.pooling import pool
from engine.types import Pooling


_HEAD_KEYS = {"cls.weight": "cls.weight", "cls.bias": "cls.bias",
              "cls.output.weight": "cls_output.weight", "cls.output.bias": "cls_output.bias",
              "cls.norm.weight": "cls_norm.weight", "cls.norm.bias": "cls_norm.bias"}


class RankHead(nn.Module):
    def __init__(self, trunk: nn.Module, hidden: int, n_out: int, present: set[str], pooling: Pooling,
                 softmax: bool, activation: Callable[[mx.array], mx.array] = mx.tanh, norm_eps: float = 1e-5,
                 cls_width: int | None = None):
        """present: the head tensors the file has (our names: cls.weight, cls_output.bias, ...); activation: after
        `cls`; norm_eps: the `cls.norm` LayerNorm's (the file's layer_norm_epsilon, as llama.cpp's build_norm);
        cls_width: `cls`'s output width (default hidden; jina-bert-v2's `cls` is the classifier, and the file has
        no `cls.output`)."""
        super().__init__()
        self.trunk = trunk
        width = cls_width or hidden
        if "cls.weight" in present:
            self.cls = nn.Linear(hidden, width, bias="cls.bias" in present)
        if "cls_norm.weight" in present:
            self.cls_norm = nn.LayerNorm(width, eps=norm_eps, bias="cls_norm.bias" in present)
        self._activation = activation
        if "cls_output.weight" in present:
            self.cls_output = nn.Linear(width, n_out, bias="cls_output.bias" in present)
        self._pooling = pooling
        self.scores_are_probabilities = softmax

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        hidden = self.trunk(input_ids, attention_mask, mx.zeros_like(input_ids))
        x = pool(hidden, attention_mask, self._pooling)
        if "cls" in self:
            x = self._activation(self.cls(x))
        if "cls_norm" in self:
            x = self.cls_norm(x)
        scores = self.cls_output(x) if "cls_output" in self else x
        return mx.softmax(scores, axis=-1) if self.scores_are_probabilities else scores

    @staticmethod
    def key(name: str) -> str | None:
        """GGUF head tensor -> our parameter name."""
        return _HEAD_KEYS.get(name)
